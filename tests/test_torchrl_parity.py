"""TorchRL's own RayCollector behaviours, with the class swapped for DaskCollector.

Written from what pytorch/rl's ``test/test_distributed.py`` checks of
``RayCollector`` (``DistributedCollectorBase`` and ``TestRayCollector``):
basic iteration, several collectors, sync and async, every ``collector_class``,
weight updates for each ``collector_class`` x ``sync`` x (``policy`` or
``policy_factory``), a ``policy_factory`` updated only through
``update_policy_weights_(weights)``, ``next()`` without ``__iter__``, the
kwargs that suite passes to Ray, and a shutdown that leaves no new Python
process. The envs and the counting policy are TorchRL's own mocks.
"""

from __future__ import annotations

import time
import warnings

import pytest
from makers import CountingPolicy, counting_policy_factory
from tensordict import TensorDict
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.envs.utils import RandomPolicy
from torchrl.testing.dist_utils import assert_no_new_python_processes, snapshot_python_processes
from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv, CountingEnv

from daskcollect import DaskCollector

# What TorchRL's suite gives RayCollector: accepted, and ignored with one warning each.
RAY_KWARGS = {
    "ray_init_config": {"address": "auto", "num_cpus": 2},
    "remote_configs": {"num_cpus": 1, "num_gpus": 0.0, "memory": 1024**2},
}
COLLECTOR_CLASSES = [Collector, MultiSyncCollector, MultiAsyncCollector]


def swapped(client, *args, **kwargs) -> DaskCollector:
    """``RayCollector(*args, **kwargs, **RAY_KWARGS)`` with the class name changed."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*specific to Ray.*")
        return DaskCollector(*args, client=client, **RAY_KWARGS, **kwargs)


def random_policy():
    return RandomPolicy(ContinuousActionVecMockEnv().action_spec)


@pytest.mark.parametrize("frames_per_batch", [50, 100])
def test_basic_iteration(client, frames_per_batch):
    collector = swapped(client, [ContinuousActionVecMockEnv] * 2, random_policy(), total_frames=1000,
                        frames_per_batch=frames_per_batch)  # fmt: skip
    total = 0
    try:
        for data in collector:
            total += data.numel()
            assert data.numel() == frames_per_batch
        assert data.names[-1] == "time"
    finally:
        collector.shutdown()
    assert total == 1000


def test_several_collectors_round_up_to_whole_batches(client):
    frames_per_batch = 200
    collector = swapped(client, [ContinuousActionVecMockEnv] * 2, random_policy(), total_frames=1000,
                        frames_per_batch=frames_per_batch)  # fmt: skip
    with collector:
        total = sum(data.numel() for data in collector)
    assert total == -frames_per_batch * (1000 // -frames_per_batch)


@pytest.mark.parametrize("sync", [False, True])
def test_sync_and_async(client, sync):
    collector = swapped(client, [ContinuousActionVecMockEnv] * 2, random_policy(), total_frames=200,
                        frames_per_batch=50, sync=sync)  # fmt: skip
    with collector:
        sizes = [data.numel() for data in collector]
    assert sizes == [50] * 4


@pytest.mark.parametrize("collector_class", COLLECTOR_CLASSES)
def test_collector_class_on_the_workers(client, collector_class):
    collector = swapped(client, [ContinuousActionVecMockEnv] * 2, random_policy(), total_frames=200,
                        frames_per_batch=50, collector_class=collector_class)  # fmt: skip
    with collector:
        sizes = [data.numel() for data in collector]
    assert sizes == [50] * 4


@pytest.mark.parametrize("collector_class", COLLECTOR_CLASSES)
@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("source", ["policy", "policy_factory"])
def test_weight_updates_reach_every_collector_class(client, collector_class, sync, source):
    """TorchRL's test: after one update, the second-to-last batch acts with the new weights."""
    frames_per_batch, total_frames = 50, 300
    n_collectors = 1 if collector_class is MultiAsyncCollector else 2
    policy = CountingPolicy()
    if source == "policy":
        collector = swapped(client, [CountingEnv] * n_collectors, policy, collector_class=collector_class,
                            total_frames=total_frames, frames_per_batch=frames_per_batch, sync=sync)  # fmt: skip
    else:
        collector = swapped(client, [CountingEnv] * n_collectors, policy_factory=counting_policy_factory,
                            collector_class=collector_class, total_frames=total_frames,
                            frames_per_batch=frames_per_batch, sync=sync)  # fmt: skip
    total, first_batch, last_batch = 0, None, None
    with collector:
        for i, data in enumerate(collector):
            total += data.numel()
            assert data.numel() == frames_per_batch
            if i == 0:
                first_batch = data
                policy.weight.data += 1
                collector.update_policy_weights_(TensorDict.from_module(policy))
            elif total == total_frames - frames_per_batch:
                last_batch = data
    assert (first_batch["action"] == 1).all(), first_batch["action"]
    assert (last_batch["action"] == 2).all(), last_batch["action"]
    assert total == total_frames


def test_policy_factory_without_weights_runs_as_built(client):
    collector = swapped(client, [CountingEnv] * 2, collector_class=Collector,
                        policy_factory=counting_policy_factory, total_frames=300, frames_per_batch=50)  # fmt: skip
    with collector:
        assert all((data["action"] == 1).all() for data in collector)


def test_next_without_iter(client):
    collector = swapped(client, [ContinuousActionVecMockEnv] * 2, random_policy(), total_frames=200,
                        frames_per_batch=50)  # fmt: skip
    with collector:
        batches = [collector.next() for _ in range(4)]
        assert all(b.numel() == 50 for b in batches)
        assert collector.next() is None  # the pass is over, as in TorchRL


def test_ray_only_kwargs_are_accepted_and_ignored_with_one_warning(client):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DaskCollector([CountingEnv] * 2, CountingPolicy(), frames_per_batch=20, total_frames=40,
                           client=client, **RAY_KWARGS) as collector:  # fmt: skip
            assert sum(b.numel() for b in collector) == 40
    ray = [str(w.message) for w in caught if "specific to Ray" in str(w.message)]
    assert sorted(ray) == sorted(
        f"{k} is specific to Ray and is ignored by DaskCollector." for k in RAY_KWARGS
    )


def test_shutdown_leaves_no_new_python_process():
    baseline_time = time.time()
    baseline = snapshot_python_processes()
    collector = DaskCollector([ContinuousActionVecMockEnv] * 2, random_policy(), total_frames=200,
                              frames_per_batch=50, collector_class=MultiSyncCollector)  # fmt: skip
    assert sum(b.numel() for b in collector) == 200
    collector.shutdown()
    assert_no_new_python_processes(baseline=baseline, baseline_time=baseline_time, timeout=30)
