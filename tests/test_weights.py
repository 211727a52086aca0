"""Weight updates: scattered once, loaded in place between rollouts, versioned."""

from __future__ import annotations

import functools
import itertools
import os
import time
import types

import dask
import pytest
import torch
from distributed.protocol import deserialize, serialize
from helpers import wait_until
from makers import constant_action_policy, make_cartpole, set_constant_action
from tensordict import TensorDict

from daskcollect import ConfigurationError, DaskCollector
from daskcollect.streams.serialization import register_serializers
from daskcollect.weights import WeightsPayload, extract_weights

register_serializers()


def actions(batch) -> torch.Tensor:
    """The action index of every frame, per collector for a sync batch."""
    return batch["action"].argmax(-1)


def per_collector(batch) -> list[set[int]]:
    return [set(actions(batch[i]).unique().tolist()) for i in range(batch.shape[0])]


def test_payload_roundtrip_keeps_dtypes_and_nesting():
    td = TensorDict(
        {
            "a": torch.randn(3, 4),
            "nested": {"b": torch.arange(5), "c": torch.randn(2).to(torch.bfloat16)},
        }
    )
    payload = WeightsPayload.pack(td, version=3)
    assert payload.version == 3 and payload.weights.is_consolidated()
    # Serialized as one out-of-band frame holding every tensor's bytes (plus the pickle).
    header, frames = serialize(payload)
    assert header["serializer"] == "dask" and len(frames) == 2
    assert len(frames[1]) >= 3 * 4 * 4 + 5 * 8 + 2 * 2
    out = deserialize(header, frames).weights
    assert set(out.keys(True, True)) == set(td.keys(True, True))
    for key in td.keys(True, True):
        assert out[key].dtype == td[key].dtype
        torch.testing.assert_close(out[key], td[key])


def test_extract_weights_from_module_and_dict():
    policy = constant_action_policy(0)
    from_module = extract_weights(policy)
    assert ("module", "linear", "bias") in from_module.keys(True, True)
    from_dict = extract_weights({"w": torch.ones(2)})
    assert from_dict["w"].sum() == 2
    with pytest.raises(ConfigurationError, match="nn.Module"):
        extract_weights(42)


def probe(client, **kwargs) -> tuple:
    """A constant-action policy (action 0) and an endless 2-collector DaskCollector running it."""
    policy = constant_action_policy(0)
    kwargs = {"frames_per_batch": 40, "total_frames": -1, "sync": True, **kwargs}
    return policy, DaskCollector(make_cartpole, policy, client=client, **kwargs)


@pytest.fixture(params=["shared-memory", "dask"])
def route(request):
    """Both ways weights reach the workers: shared memory (same host), or Dask (other hosts)."""
    with dask.config.set({"daskcollect.weights.shared-memory": request.param == "shared-memory"}):
        yield request.param


def test_update_reaches_workers_only_after_update(client, route):
    policy, collector = probe(client, track_policy_version=True)
    with collector:
        it = iter(collector)
        batch = next(it)
        assert per_collector(batch) == [{0}, {0}]
        assert batch["policy_version"].unique().tolist() == [0]

        set_constant_action(policy, 1)  # the driver changes; the workers must not yet
        assert per_collector(next(it)) == [{0}, {0}]

        collector.update_policy_weights_()
        batch = next(it)
        assert per_collector(batch) == [{1}, {1}]
        assert batch["policy_version"].unique().tolist() == [1]
        assert collector.policy_version == 1

        # Only collector 0 gets the next weights.
        set_constant_action(policy, 0)
        collector.update_policy_weights_(worker_ids=[0])
        batch = next(it)
        assert per_collector(batch) == [{0}, {1}]
        assert batch["policy_version"][0].unique().tolist() == [2]
        assert batch["policy_version"][1].unique().tolist() == [1]

        # Weights passed explicitly, as a TensorDict, by keyword.
        other = constant_action_policy(1)
        collector.update_policy_weights_(weights=TensorDict.from_module(other))
        assert per_collector(next(it)) == [{1}, {1}]

        with pytest.raises(ConfigurationError, match="worker_ids"):
            collector.update_policy_weights_(worker_ids=[5])
        # The workers share this host: the route taken is the one configured.
        assert [c["weights_route"] for c in collector.stats()["collectors"]] == [route] * 2


def test_update_after_each_batch(client):
    policy, collector = probe(client, update_after_each_batch=True)
    with collector:
        it = iter(collector)
        assert per_collector(next(it)) == [{0}, {0}]
        set_constant_action(policy, 1)
        assert per_collector(next(it)) == [{1}, {1}]


def test_max_weight_update_interval(client):
    policy, collector = probe(client, max_weight_update_interval=1)
    with collector:
        set_constant_action(policy, 1)
        it = iter(collector)
        # Collectors run on their weights for 2 batches (> 1), then are refreshed.
        seen = [per_collector(next(it)) for _ in range(4)]
    assert seen == [[{0}, {0}], [{0}, {0}], [{1}, {1}], [{1}, {1}]]


def test_async_update_reaches_rearmed_collectors(client):
    policy, collector = probe(client, track_policy_version=True, sync=False)
    with collector:
        it = iter(collector)
        next(it)
        set_constant_action(policy, 1)
        collector.update_policy_weights_()
        # Calls already in flight finish on version 0; then each collector runs on
        # version 1 and acts accordingly. Versions never go back, per collector.
        per_collector: dict[int, list[int]] = {}
        for _ in range(12):
            batch = next(it)
            version = batch["policy_version"].unique().tolist()
            assert len(version) == 1
            cid = int(batch["collector", "collector_id"][0])
            per_collector.setdefault(cid, []).append(version[0])
            if version[0] == 1:
                assert set(actions(batch).unique().tolist()) == {1}
        assert set(per_collector) == {0, 1}
        for versions in per_collector.values():
            assert versions == sorted(versions) and versions[-1] == 1


def test_no_policy_update_needs_weights(client):
    with DaskCollector(make_cartpole, frames_per_batch=20, total_frames=40, client=client) as collector:
        with pytest.raises(ConfigurationError, match="without a policy"):
            collector.update_policy_weights_()


def test_one_leader_per_host_for_the_dask_route():
    from daskcollect.weights.scatter import host_leaders

    addresses = ["tcp://10.0.0.2:4001", "tcp://10.0.0.1:4002", "tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001"]
    assert host_leaders(addresses) == ["tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001"]
    assert host_leaders([]) == []


def test_tree_copies_reach_every_worker_and_outlive_the_memory_manager(client):
    """The host-to-host copy: every collector's worker holds the version, unreachable workers are
    left out, and the Active Memory Manager (on in this cluster) does not drop the copies."""
    from distributed.utils import sync

    from daskcollect.weights import tree

    policy, collector = probe(client, num_collectors=2)
    with collector:  # its actors make the workers answer the tree's requests
        workers = sorted(collector.workers)
        ours = collector.client
        payload = WeightsPayload.pack(extract_weights(policy), 7)
        future = ours.scatter(payload, workers=workers[:1], hash=False, direct=True)
        gone = "tcp://127.0.0.1:9"  # nothing listens there
        deadline = time.monotonic() + 3
        left_out = sync(
            ours.loop, tree.copy_along_tree, ours, future.key, [*workers, gone], deadline, callback_timeout=30
        )
        assert left_out == [gone]
        assert client.amm.running()
        client.amm.run_once()  # what it does every two seconds

        def version_held(dask_worker, key=future.key):
            payload = tree.held(dask_worker, key)
            return None if payload is None else payload.version

        assert client.run(version_held, workers=workers) == dict.fromkeys(workers, 7)


def test_one_deadline_bounds_the_fan_out_and_the_version_moves_only_after_it(client):
    """A fan-out that cannot finish raises within its one timeout, and the version stays; a deadline
    already past leaves every copy out at once instead of granting each round a timeout."""
    from distributed.utils import sync

    from daskcollect.weights import WeightRouter, tree
    from daskcollect.weights.scatter import ScatterTransport

    weights = extract_weights(constant_action_policy(0))
    router = WeightRouter(ScatterTransport(client, timeout=1.0), None, weights)
    gone = types.SimpleNamespace(index=0, address="tcp://127.0.0.1:9", on_driver_host=False)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        router.publish(weights, [gone])
    assert time.monotonic() - start < 5
    assert router.version == 0 and router.pending(0) is None
    router.close(timeout=1.0)

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    start = time.monotonic()
    left_out = sync(client.loop, tree.copy_along_tree, client, "no-such-key", [*workers, "tcp://127.0.0.1:9"],
                    start - 1, callback_timeout=10)  # fmt: skip
    assert left_out == [*workers[1:], "tcp://127.0.0.1:9"] and time.monotonic() - start < 1


def held_versions(dask_worker) -> list[str]:
    from daskcollect.weights import tree

    return tree.held_keys()


def test_workers_forget_the_copies_when_the_collection_closes(client):
    """The Dask route's copies are kept for the last versions while collecting, and gone after."""
    with dask.config.set({"daskcollect.weights.shared-memory": False}):
        policy, collector = probe(client, num_collectors=2)
    with collector:
        it = iter(collector)
        for action in (1, 0, 1, 0, 1):
            set_constant_action(policy, action)
            collector.update_policy_weights_()
            assert per_collector(next(it)) == [{action}, {action}]
        # The leader holds each version in Dask's data; the others fetch it and keep the last ones.
        held = [len(keys) for keys in client.run(held_versions).values()]
        assert sum(held) >= 1 and max(held) <= 3
    assert wait_until(lambda: not any(client.run(held_versions).values()), timeout=10)


def bias_read(ref) -> list[float]:
    """Reads weights as an actor does, in a task on a worker (``get_worker()`` is set there)."""
    from distributed import get_worker

    return ref.read(get_worker(), 10.0)["module", "linear", "bias"].tolist()


def test_weights_a_worker_was_not_sent_are_fetched_from_a_worker_that_has_them(client):
    """The Dask route's fallback (a worker that joined later, or whose leader left): with no holder
    left to ask, the version is fetched from a worker that the scheduler lists as holding it."""
    from daskcollect.weights.scatter import ScatterRef

    first, second = sorted(client.scheduler_info(n_workers=-1)["workers"])
    payload = WeightsPayload.pack(extract_weights(constant_action_policy(1)), 1)
    future = client.scatter(payload, workers=[first], hash=False, direct=True)
    ref = ScatterRef(1, future.key, holders=())
    read = client.submit(bias_read, ref, workers=[second], allow_other_workers=False, pure=False)
    assert read.result(timeout=30) == [0.0, 1.0]


def test_weights_of_the_wrong_shape_are_refused_on_the_driver(client):
    from makers import CountingPolicy

    policy, collector = probe(client, num_collectors=1)
    with collector:
        wrong = TensorDict.from_module(CountingPolicy())
        with pytest.raises(ConfigurationError, match="do not fit the policy") as info:
            collector.update_policy_weights_(wrong)
        assert "Nothing was sent" in str(info.value) and info.value.missing
        assert collector.policy_version == 0
        bigger = TensorDict.from_module(policy).apply(lambda t: torch.zeros(t.shape[0] + 1, *t.shape[1:]))
        with pytest.raises(ConfigurationError, match="instead of"):
            collector.update_policy_weights_(bigger)


def make_gated_cartpole(gate: str, after: int):
    """CartPole whose step ``after + 1`` (the first of its second rollout) waits, bounded, for the
    file ``gate``; it marks that it waits with a file ``<gate>.waiting-<pid>``."""
    env = make_cartpole()
    original, steps = env._step, itertools.count(1)

    def _step(tensordict):
        if next(steps) == after + 1:
            open(f"{gate}.waiting-{os.getpid()}", "w").close()
            wait_until(lambda: os.path.exists(gate), timeout=60, interval=0.01)
        return original(tensordict)

    env._step = _step
    return env


def test_async_calls_queued_before_an_update_start_on_it(client, tmp_path):
    """Two calls in flight per collector (async-depth 2). When the update is sent, each collector's
    rollout 1 runs (held at a gate), and the collector of the first batch has rollout 2 queued, sent
    with no weights. Rollouts 0 and 1 are collected on version 0; every later one, the queued one
    included, on version 1."""
    gate = tmp_path / "gate"
    policy = constant_action_policy(0)
    with dask.config.set({"daskcollect.async-depth": 2}):
        collector = DaskCollector(functools.partial(make_gated_cartpole, str(gate), 40), policy,
                                  frames_per_batch=40, total_frames=-1, num_collectors=2,
                                  track_policy_version=True, client=client)  # fmt: skip
    with collector:
        it = iter(collector)
        first = next(it)
        assert first["collector", "rollout_id"].unique().tolist() == [0]
        assert wait_until(lambda: len(list(tmp_path.glob("gate.waiting-*"))) == 2, timeout=30)
        set_constant_action(policy, 1)
        collector.update_policy_weights_()
        gate.touch()
        versions: dict[tuple[int, int], int] = {}
        for _ in range(12):
            batch = next(it)
            cid, rid = (int(batch["collector", key][0]) for key in ("collector_id", "rollout_id"))
            (versions[cid, rid],) = batch["policy_version"].unique().tolist()
            assert set(actions(batch).unique().tolist()) == {versions[cid, rid]}
    for (cid, rid), version in versions.items():
        assert version == (0 if rid <= 1 else 1), (cid, rid, version)
    assert {cid for cid, rid in versions if rid >= 2} == {0, 1}
