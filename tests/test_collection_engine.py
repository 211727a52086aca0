"""Fault tolerance: real processes, real kills. Lost workers are replaced, nothing is yielded twice."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import dask
import psutil
import pytest
import torch
from distributed import Client
from helpers import NO_SCHEDULER
from makers import (
    constant_action_policy,
    make_cartpole,
    make_env_failing_once,
    make_env_hanging_once,
    set_constant_action,
)

from daskcollect import ClusterConnectionError, CollectorLostError, ConfigurationError, DaskCollector
from daskcollect.worker.rollout import TRAJ_ID_BITS

FAST = {"daskcollect.restart-delay": "0.2s"}


def kill_worker_of(client: Client, address: str) -> int:
    pid = client.run(os.getpid, workers=[address])[address]
    psutil.Process(pid).send_signal(signal.SIGKILL)
    return pid


def provenance(batch) -> set[tuple[int, int]]:
    pairs = torch.stack(
        [batch["collector", "collector_id"].reshape(-1), batch["collector", "rollout_id"].reshape(-1)], 1
    )
    return {tuple(p) for p in pairs.unique(dim=0).tolist()}


def check_no_duplicates(batches, per_rollout_frames: int) -> None:
    seen: set[tuple[int, int]] = set()
    owner: dict[int, int] = {}
    for batch in batches:
        pairs = provenance(batch)
        assert not pairs & seen, f"(collector, rollout) yielded twice: {pairs & seen}"
        seen |= pairs
        ids, cids = batch["collector", "traj_ids"].reshape(-1), batch["collector", "collector_id"].reshape(-1)
        assert ((ids >> TRAJ_ID_BITS) == cids).all()  # traj ids live in their collector's namespace
        for t, c in zip(ids.tolist(), cids.tolist()):
            assert owner.setdefault(t, c) == c
    for pair in seen:  # every rollout is whole
        frames = sum(
            int(
                (
                    (b["collector", "collector_id"] == pair[0]) & (b["collector", "rollout_id"] == pair[1])
                ).sum()
            )
            for b in batches
        )
        assert frames == per_rollout_frames


@pytest.mark.parametrize("sync", [True, False])
def test_sigkill_during_collection(make_cluster, sync):
    cluster = make_cluster(n_workers=3)  # one spare worker may host the replacement at once
    policy = constant_action_policy(0)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        with DaskCollector(
            make_cartpole, policy, frames_per_batch=200, total_frames=200 * 30, sync=sync, num_collectors=2,
            track_policy_version=True, client=client, seed=3,  # the replacement is built with a seed too
        ) as collector:  # fmt: skip
            batches = []
            for i, batch in enumerate(collector):
                batches.append(batch)
                if i == 3:
                    set_constant_action(policy, 1)
                    collector.update_policy_weights_()
                if i == 5:
                    kill_worker_of(client, collector.workers[0])
            stats = collector.stats()
    assert len(batches) == 30
    assert sum(b.numel() for b in batches) == 200 * 30  # the run reaches total_frames
    if sync:
        assert all(b.batch_size == torch.Size([2, 100]) for b in batches)  # the lost share was re-collected
    check_no_duplicates(batches, per_rollout_frames=100 if sync else 200)
    assert stats["restarts"] == 1 and stats["frames_lost"] > 0 and stats["rollouts_lost"] >= 1
    assert stats["live_collectors"] == 2
    # The replacement got the latest weights: its frames carry version 1 and act accordingly.
    first_ids = {int(c) for b in batches[:4] for c in b["collector", "collector_id"].unique()}
    late = [b for b in batches[-5:]]
    newcomers = [b[b["collector", "collector_id"] >= 2] for b in late]
    newcomers = [b for b in newcomers if b.numel()]
    assert newcomers and first_ids == {0, 1}
    for b in newcomers:
        assert (b["policy_version"] == 1).all()
        assert (b["action"].argmax(-1) == 1).all()


def test_restart_bound(make_cluster):
    cluster = make_cluster(n_workers=3)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        collector = DaskCollector(
            make_cartpole, frames_per_batch=100, total_frames=-1, num_collectors=2, max_collector_restarts=0,
            client=client,
        )  # fmt: skip
        with pytest.raises(CollectorLostError, match="max_collector_restarts=0") as info:
            for i, _ in enumerate(collector):
                if i == 2:
                    kill_worker_of(client, collector.workers[1])
                assert i < 200
        assert "Last failure: collector 1" in str(info.value)
        assert collector.closed


def test_env_error_restart(client, tmp_path):
    flag = str(tmp_path / "broke")
    with dask.config.set(FAST), DaskCollector(
        functools.partial(make_env_failing_once, flag), frames_per_batch=100, total_frames=1000, sync=True,
        on_env_error="restart", client=client,
    ) as collector:  # fmt: skip
        batches = list(collector)
        stats = collector.stats()
    assert os.path.exists(flag)
    assert len(batches) == 10 and all(b.batch_size == torch.Size([2, 50]) for b in batches)
    assert stats["env_restarts"] == 1 and stats["restarts"] == 0 and stats["frames_lost"] == 50
    check_no_duplicates(batches, per_rollout_frames=50)


def test_hung_env_is_replaced(make_cluster, tmp_path):
    cluster = make_cluster(n_workers=2)
    flag = str(tmp_path / "hung")
    timeouts = {**FAST, "daskcollect.timeouts.rollout": "4s"}
    with Client(cluster, set_as_default=False) as client, dask.config.set(timeouts):
        start = time.monotonic()
        with DaskCollector(
            functools.partial(make_env_hanging_once, flag), frames_per_batch=100, total_frames=1200,
            num_collectors=2, client=client,
        ) as collector:  # fmt: skip
            batches = list(collector)
            stats = collector.stats()
    assert os.path.exists(flag)
    assert len(batches) == 12 and stats["restarts"] == 1
    assert time.monotonic() - start < 90
    check_no_duplicates(batches, per_rollout_frames=100)


def test_losing_the_scheduler_is_a_clear_error(make_cluster):
    cluster = make_cluster(n_workers=2)
    with dask.config.set({**FAST, "daskcollect.timeouts.connect": "3s"}):
        collector = DaskCollector(
            make_cartpole, frames_per_batch=100, total_frames=-1, client=cluster.scheduler_address
        )
        start = None
        with pytest.raises(ClusterConnectionError, match="Lost the scheduler"):
            for i, _ in enumerate(collector):
                if i == 2:
                    start = time.monotonic()
                    threading.Thread(target=lambda: cluster.sync(cluster.scheduler.close)).start()
                assert i < 10_000
        assert time.monotonic() - start < 30
        assert collector.closed


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_soak_repeated_kills(make_cluster):
    """A collector's worker is killed every few seconds through a run of more than 50k frames.

    5 workers for 3 collectors: a replacement takes a spare while the killed worker's nanny brings
    it back. A kill waits (without blocking the loop) until the cluster is whole again: on a loaded
    2-core machine a nanny's restart can take longer than the 3 s cadence, and the test is about
    daskcollect's recovery, not the nannies' speed.
    """
    cluster = make_cluster(n_workers=5)
    kills = 0
    with (
        Client(cluster, set_as_default=False) as client,
        dask.config.set({**FAST, "daskcollect.timeouts.workers": "60s"}),
    ):
        with DaskCollector(
            make_cartpole, frames_per_batch=500, total_frames=60_000, num_collectors=3, client=client,
        ) as collector:  # fmt: skip
            batches, last_kill, start = [], time.monotonic(), time.monotonic()
            for batch in collector:
                batches.append(batch)
                whole = len(client.nthreads()) == 5
                if time.monotonic() - last_kill > 3 and kills < 8 and whole:
                    kill_worker_of(client, collector.workers[kills % 3])
                    kills, last_kill = kills + 1, time.monotonic()
                assert time.monotonic() - start < 240
            stats = collector.stats()
    frames = sum(b.numel() for b in batches)
    print(f"\nsoak: frames={frames} kills={kills} restarts={stats['restarts']} "
          f"frames_lost={stats['frames_lost']} rollouts_lost={stats['rollouts_lost']}")  # fmt: skip
    assert frames == 60_000 and kills >= 3
    assert stats["restarts"] >= kills - 1  # a kill during a replacement can land on a fresh worker
    check_no_duplicates(batches, per_rollout_frames=500)


@pytest.mark.parametrize("sync", [True, False])
def test_follows_the_cluster_when_workers_join(make_cluster, sync):
    cluster = make_cluster(n_workers=2)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        with DaskCollector(
            make_cartpole, frames_per_batch=100, total_frames=-1, sync=sync, client=client
        ) as collector:  # a client and no num_collectors: follow the cluster
            it = iter(collector)
            assert [next(it).numel() for _ in range(3)] and collector.num_collectors == 2
            cluster.scale(3)
            client.wait_for_workers(3, timeout=30)
            batches_until_joined = 0
            while collector.stats()["live_collectors"] < 3:
                next(it)
                batches_until_joined += 1
                assert batches_until_joined <= 2, "a joining worker gets a collector within two batches"
            # Async mode has the older collectors' queued calls ahead of the newcomer's first one.
            later = []
            while not any((b["collector", "collector_id"] == 2).any() for b in later) and len(later) < 20:
                later.append(next(it))
    assert collector.num_collectors == 3
    newcomer = [b for b in later if (b["collector", "collector_id"] == 2).any()]
    assert newcomer, "the new collector contributes batches"
    if sync:
        assert later[-1].batch_size == torch.Size([3, 50])  # each collector keeps its share


def test_auto_needs_a_single_constructor():
    with pytest.raises(ConfigurationError, match="auto"):
        DaskCollector(
            [make_cartpole, make_cartpole], frames_per_batch=10, num_collectors="auto", client=NO_SCHEDULER
        )


def retire_events(cluster) -> tuple[list[str], list[str]]:
    """Workers the scheduler retired, and those it refused to retire.

    Read from the in-process scheduler: Dask's own "replicate" events hold
    WorkerState objects, which Client.get_events("all") cannot deserialize.
    """
    retired, refused = [], []
    for _, msg in cluster.scheduler.get_events("all"):
        if isinstance(msg, dict) and msg.get("action") == "retire-workers":
            retired += list(msg["retired"])
            refused += list(msg["could-not-retire"])
    return retired, refused


@pytest.mark.parametrize("sync", [True, False])
def test_follows_the_cluster_when_it_shrinks(make_cluster, sync):
    """Scale-down retires a collector's worker gracefully: its rollouts are delivered, nothing is lost."""
    cluster = make_cluster(n_workers=3)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        with DaskCollector(
            make_cartpole, frames_per_batch=90, total_frames=-1, sync=sync, client=client
        ) as collector:  # fmt: skip
            it = iter(collector)
            batches = [next(it) for _ in range(3)]
            cluster.scale(2)
            batches += [next(it) for _ in range(20)]
            stats = collector.stats()
    assert stats["live_collectors"] == 2 and stats["retired"] == 1
    assert stats["restarts"] == 0 and stats["rollouts_lost"] == 0 and stats["frames_lost"] == 0
    if sync:
        assert batches[-1].batch_size == torch.Size([2, 30])
    check_no_duplicates(batches, per_rollout_frames=30 if sync else 90)


@pytest.mark.parametrize("sync", [True, False])
def test_retire_workers_moves_the_collector_to_a_free_worker(make_cluster, sync):
    """Client.retire_workers on a collector's worker: Dask retires it, a free worker takes over the index."""
    cluster = make_cluster(n_workers=3)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        with DaskCollector(
            make_cartpole, num_collectors=2, frames_per_batch=100, total_frames=-1, sync=sync, client=client
        ) as collector:  # fmt: skip
            it = iter(collector)
            batches = [next(it) for _ in range(3)]
            leaving = collector.workers[1]
            client.retire_workers([leaving], close_workers=True)
            batches += [next(it) for _ in range(10)]
            stats = collector.stats()
            workers = collector.workers
        retired, refused = retire_events(cluster)
    assert retired == [leaving] and not refused, "Dask retired the worker instead of refusing it"
    assert leaving not in workers and len(workers) == 2
    assert stats["retired"] == 1 and stats["restarts"] == 0 and stats["rollouts_lost"] == 0
    if sync:
        assert all(b.batch_size == torch.Size([2, 50]) for b in batches)  # the shape is kept
    check_no_duplicates(batches, per_rollout_frames=50 if sync else 100)


def test_worker_lifetime_restarts_lose_nothing(make_cluster):
    """Workers started with --lifetime retire and come back; the collectors follow, losing no rollout."""
    cluster = make_cluster(n_workers=2, lifetime="8s", lifetime_stagger="2s", lifetime_restart=True)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        first = set(client.scheduler_info()["workers"])
        with DaskCollector(
            make_cartpole, num_collectors=2, frames_per_batch=100, total_frames=-1, client=client
        ) as collector:  # fmt: skip
            batches, deadline = [], time.monotonic() + 90
            for batch in collector:
                batches.append(batch)
                if (collector.stats()["retired"] >= 2 and not set(collector.workers) & first) or (
                    time.monotonic() > deadline
                ):
                    break
            batches += [b for b, _ in zip(collector, range(4))]
            # The workers go on retiring every 6-10 s, so at a given batch one of them may be
            # between lives: wait (bounded) for a batch when both collectors are back.
            deadline = time.monotonic() + 30
            for batch in collector:
                batches.append(batch)
                if collector.stats()["live_collectors"] == 2 or time.monotonic() > deadline:
                    break
            stats = collector.stats()
    assert stats["retired"] >= 2 and not set(collector.workers) & first, stats
    assert stats["live_collectors"] == 2 and stats["restarts"] == 0 and stats["rollouts_lost"] == 0
    check_no_duplicates(batches, per_rollout_frames=100)
