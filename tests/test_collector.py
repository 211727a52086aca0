"""The TorchRL collector contract: shapes, keys, batch counts, seeds, state, shutdown."""

from __future__ import annotations

import dask
import pytest
import torch
from helpers import actors_on, children, wait_until
from makers import cartpole_policy, make_cartpole
from tensordict import TensorDict
from torchrl.collectors import BaseCollector, Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer

from daskcollect import CollectorClosedError, DaskCollector, EndlessCollectionError
from daskcollect.worker.rollout import TRAJ_ID_BITS


@pytest.mark.parametrize("sync", [True, False])
def test_contract(client, sync):
    with DaskCollector(
        make_cartpole, cartpole_policy(), frames_per_batch=100, total_frames=500, sync=sync, client=client
    ) as collector:
        assert isinstance(collector, BaseCollector)
        assert collector.num_collectors == 2  # the cluster's worker count
        assert len(collector) == 5
        batches = list(collector)
        assert len(batches) == 5
        for batch in batches:
            if sync:
                assert batch.batch_size == torch.Size([2, 50])
                assert batch.names == [None, "time"]
            else:
                assert batch.batch_size == torch.Size([100])
                assert batch.names == ["time"]
            keys = set(batch.keys(True, True))
            for key in [
                "observation",
                "action",
                ("next", "reward"),
                ("next", "done"),
                ("collector", "traj_ids"),
            ]:
                assert key in keys
            assert batch.device is None or batch.device.type == "cpu"
        assert collector.stats()["frames"] == sum(b.numel() for b in batches)


def test_list_of_constructors_and_rounding(client):
    # A list sets num_collectors; sync splits 101 frames as ceil(101 / 2) = 51 each.
    with DaskCollector(
        [make_cartpole, make_cartpole],
        frames_per_batch=101,
        total_frames=303,
        sync=True,
        client=client,
    ) as collector:
        assert collector.num_collectors == 2
        batches = list(collector)
    assert len(batches) == 3
    assert all(b.batch_size == torch.Size([2, 51]) for b in batches)


def test_traj_ids_unique_across_collectors(client):
    with DaskCollector(make_cartpole, frames_per_batch=200, total_frames=1200, client=client) as collector:
        owners: dict[int, set[int]] = {}
        for batch in collector:
            ids = batch["collector", "traj_ids"].unique().tolist()
            namespace = {i >> TRAJ_ID_BITS for i in ids}
            assert len(namespace) == 1  # an async batch comes from one collector
            for i in ids:
                owners.setdefault(i, set()).update(namespace)
    assert len(owners) > 10
    assert all(len(o) == 1 for o in owners.values())  # no id is shared by two collectors
    assert {next(iter(o)) for o in owners.values()} == {0, 1}


def test_len_endless_raises(client):
    with DaskCollector(make_cartpole, frames_per_batch=50, client=client) as collector:
        with pytest.raises(EndlessCollectionError, match="total_frames"):
            len(collector)
        with pytest.raises(TypeError):
            len(collector)
        # Endless iteration goes on until the user breaks out.
        for i, _ in enumerate(collector):
            if i == 6:
                break
        assert collector.stats()["batches"] == 7


def test_sync_matches_torchrl_collectors_value_for_value(client):
    """With seeds, sync mode yields the frames of N seeded TorchRL Collectors."""
    seed, n, fpc, rounds = 7, 2, 60, 3
    with DaskCollector(
        make_cartpole,
        cartpole_policy(0),
        frames_per_batch=n * fpc,
        total_frames=n * fpc * rounds,
        sync=True,
        seed=seed,
        client=client,
    ) as collector:
        ours = list(collector)

    refs, s = [], seed
    for _ in range(n):
        ref = Collector(make_cartpole(), cartpole_policy(0), frames_per_batch=fpc, total_frames=-1)
        s = ref.set_seed(s)
        refs.append(ref)
    for ref in refs:
        ref.reset()  # MultiSyncCollector.set_seed resets after seeding
    iters = [iter(r) for r in refs]
    for batch in ours:
        expected = torch.stack([next(it) for it in iters], 0)
        ids = expected["collector", "traj_ids"]
        offsets = torch.arange(n).view(n, 1) << TRAJ_ID_BITS
        expected["collector", "traj_ids"] = torch.where(ids >= 0, ids + offsets, ids)
        ours = {
            ("collector", "index"),
            ("collector", "collector_id"),
            ("collector", "rollout_id"),
        }  # provenance
        assert set(batch.keys(True, True)) == set(expected.keys(True, True)) | ours
        for key in expected.keys(True, True):
            torch.testing.assert_close(batch[key], expected[key], msg=f"key {key} differs")
    for r in refs:
        r.shutdown()


def test_set_seed_is_reproducible(client):
    def first_obs(seed):
        with DaskCollector(
            make_cartpole, frames_per_batch=20, total_frames=40, sync=True, client=client
        ) as c:
            out = c.set_seed(seed)
            return out, next(iter(c))["observation"]

    s1, a = first_obs(3)
    s2, b = first_obs(3)
    _, c = first_obs(4)
    assert s1 == s2
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


def test_state_dict_roundtrip(client):
    with DaskCollector(
        make_cartpole, cartpole_policy(), frames_per_batch=40, total_frames=120, sync=True, client=client
    ) as collector:
        list(collector)
        sd = collector.state_dict()
        assert len(sd["collectors"]) == 2 and [c["rollouts"] for c in sd["collectors"]] == [3, 3]
        assert sd["frames"] == 120 and sd["iterations"] == 3
        collector.load_state_dict(sd)
        assert collector.state_dict()["frames"] == 120
        # RayCollector's form: one TorchRL state dict per collector.
        policy_state = cartpole_policy().state_dict()
        collector.load_state_dict([{"policy_state_dict": policy_state, "env_state_dict": {}, "frames": 0,
                                    "iter": 0}] * 2)  # fmt: skip


def test_replay_buffer_feed(client):
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    with DaskCollector(
        make_cartpole, frames_per_batch=100, total_frames=300, sync=True, replay_buffer=rb, client=client
    ) as collector:
        out = list(collector)
    assert out == [None, None, None]
    assert len(rb) == 300
    assert isinstance(rb.sample(8), TensorDict)


def test_shutdown_idempotent_and_leaves_users_cluster(client):
    collector = DaskCollector(make_cartpole, frames_per_batch=50, total_frames=100, client=client)
    assert collector.client is client  # the user's, as given
    assert sum(len(v) for v in actors_on(client).values()) == 2
    next(iter(collector))
    collector.shutdown()
    assert collector.client is client and client.status == "running"  # left open, as given
    collector.shutdown()  # twice is fine
    assert wait_until(lambda: sum(len(v) for v in actors_on(client).values()) == 0)
    plugins = client.run(lambda dask_worker: list(dask_worker.plugins))
    assert not any(name.startswith("daskcollect") for names in plugins.values() for name in names)
    assert client.submit(lambda: 41 + 1).result(timeout=30) == 42  # the user's client still works
    with pytest.raises(CollectorClosedError, match="shut down"):
        next(iter(collector))
    with pytest.raises(CollectorClosedError):
        collector.update_policy_weights_()


def test_private_cluster_leaves_no_process():
    before = children()
    with DaskCollector(make_cartpole, frames_per_batch=50, total_frames=100, num_collectors=2) as collector:
        assert collector.dashboard_link is None or collector.dashboard_link.startswith("http://127.0.0.1")
        assert all(a.startswith("tcp://127.0.0.1") for a in collector.workers)
        assert len(children() - before) >= 2
        assert len(list(collector)) == 2
    assert wait_until(lambda: children() <= before, timeout=30)


@pytest.mark.parametrize("setting", ["auto", 3, None])
def test_driver_leaves_local_collectors_their_cores(client, setting):
    """As TorchRL's multiprocess collectors: the learner's threads do not fight the rollouts for cores."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        with dask.config.set({"daskcollect.driver.torch-threads": setting}):
            with DaskCollector(
                make_cartpole, frames_per_batch=50, total_frames=100, client=client
            ) as collector:
                during = torch.get_num_threads()
                assert len(list(collector)) == 2
        expected = {"auto": 4 - 2, 3: 3, None: 4}[setting]  # two collectors on this host
        assert during == expected and torch.get_num_threads() == 4  # restored at shutdown
    finally:
        torch.set_num_threads(before)


def test_keyboard_interrupt_shuts_down_then_reraises(client):
    def interrupt(batch):
        raise KeyboardInterrupt

    collector = DaskCollector(
        make_cartpole, frames_per_batch=50, total_frames=500, postproc=interrupt, client=client
    )
    with pytest.raises(KeyboardInterrupt):
        for _ in collector:
            pass
    assert collector.closed
    assert wait_until(lambda: sum(len(v) for v in actors_on(client).values()) == 0)


@pytest.mark.parametrize("layout", ["parallel-env", "multisync"])
def test_num_workers_per_collector(client, layout):
    cls = Collector if layout == "parallel-env" else "sync"
    with DaskCollector(
        make_cartpole,
        frames_per_batch=80,
        total_frames=160,
        num_workers_per_collector=2,
        collector_class=cls,
        num_collectors=1,
        client=client,
    ) as collector:
        batches = list(collector)
    assert len(batches) == 2
    assert all(b.numel() == 80 for b in batches)


def test_a_collector_left_open_at_interpreter_exit_raises_nothing(cluster, tmp_path):
    """``__del__`` only warns, and at interpreter exit it stays silent (no AttributeError)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "left_open.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from daskcollect import DaskCollector
            from makers import make_cartpole

            if __name__ == "__main__":
                collector = DaskCollector(make_cartpole, frames_per_batch=50, total_frames=100,
                                          num_collectors=1, client="{cluster.scheduler_address}")
                print(sum(b.numel() for b in collector))
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "100", out.stderr[-3000:]
    assert "__del__" not in out.stderr and "'NoneType' object" not in out.stderr, out.stderr[-3000:]


def test_frames_say_where_they_came_from_unless_tracing_is_off(client):
    kwargs = dict(frames_per_batch=40, total_frames=80, sync=True, track_policy_version=True, client=client)
    with DaskCollector(make_cartpole, cartpole_policy(), **kwargs) as collector:
        batch = next(iter(collector))
        collector.update_policy_weights_()
        later = next(iter(collector))
    assert batch["collector", "index"][:, 0].tolist() == [0, 1]
    assert batch["collector", "rollout_id"].unique().tolist() == [0]
    assert (batch["next", "policy_version"] == 0).all() and (later["policy_version"] == 1).all()
    with DaskCollector(make_cartpole, cartpole_policy(), trace_frames=False, **kwargs) as collector:
        batch = next(iter(collector))
    keys = set(batch.keys(True, True))
    assert not keys & {("collector", "index"), ("collector", "collector_id"), ("collector", "rollout_id")}
    assert ("collector", "traj_ids") in keys and "policy_version" in keys
