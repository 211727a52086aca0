"""TorchRL's weight-sync keywords, ``weight_sync_schemes=`` and ``weight_updater=``, as RayCollector takes them."""

from __future__ import annotations

import time

import pytest
import torch
from makers import CountingPolicy, counting_policy_factory
from tensordict import TensorDict
from torchrl.collectors import Collector, MultiSyncCollector, RayWeightUpdater, WeightUpdaterBase
from torchrl.testing.mocking_classes import CountingEnv
from torchrl.weight_update import (
    NoWeightSyncScheme,
    RayWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightSyncScheme,
)

from daskcollect import ConfigurationError, DaskCollector, DaskWeightSyncScheme, DaskWeightUpdater


def collector_for(client, **kwargs) -> DaskCollector:
    """Two collectors of TorchRL's CountingEnv, in sync mode: one row of each batch per collector."""
    kwargs.setdefault("policy", CountingPolicy())
    return DaskCollector([CountingEnv] * 2, frames_per_batch=20, total_frames=-1, sync=True,
                         client=client, **kwargs)  # fmt: skip


def acted(batch) -> list[set[float]]:
    """The actions each collector took in a sync batch (CountingPolicy acts with its weight)."""
    return [set(batch["action"][i].flatten().tolist()) for i in range(batch.shape[0])]


def weights_of(value: float) -> TensorDict:
    return TensorDict.from_module(CountingPolicy(value)).data


@pytest.mark.parametrize("strategy", ["tensordict", "state_dict"])
def test_a_dask_scheme_sends_to_the_collectors_named(client, strategy):
    policy = CountingPolicy()
    scheme = DaskWeightSyncScheme(strategy=strategy)
    with collector_for(client, policy=policy, weight_sync_schemes={"policy": scheme}) as collector:
        batches = iter(collector)
        assert acted(next(batches)) == [{1.0}, {1.0}]
        policy.weight.data += 1
        collector.update_policy_weights_(worker_ids=[1])  # the driver's policy, to collector 1 only
        assert acted(next(batches)) == [{1.0}, {2.0}]
        scheme.send(weights_of(5.0))  # TorchRL's scheme API reaches every collector
        assert acted(next(batches)) == [{5.0}, {5.0}]
        assert scheme.initialized_on_sender and scheme.synchronized_on_sender
    assert not scheme.initialized_on_sender  # let go at shutdown


@pytest.mark.parametrize("source", ["policy", "policy_factory"])
def test_a_dask_scheme_reaches_the_processes_of_inner_multisync_collectors(client, source):
    build = {"policy": CountingPolicy()} if source == "policy" else {"policy": None,
                                                                     "policy_factory": counting_policy_factory}  # fmt: skip
    with collector_for(client, collector_class=MultiSyncCollector, num_workers_per_collector=2,
                       weight_sync_schemes={"policy": DaskWeightSyncScheme()}, **build) as collector:  # fmt: skip
        batches = iter(collector)
        assert acted(next(batches)) == [{1.0}, {1.0}]
        collector.update_policy_weights_(weights_of(3.0))
        assert acted(next(batches)) == [{3.0}, {3.0}]


def test_no_weight_sync_scheme_turns_updates_off(client):
    with collector_for(client, weight_sync_schemes={"policy": NoWeightSyncScheme()},
                       update_after_each_batch=True) as collector:  # fmt: skip
        batches = iter(collector)
        next(batches)
        collector.update_policy_weights_(weights_of(7.0))
        assert acted(next(batches)) == [{1.0}, {1.0}]


def test_a_ray_scheme_is_replaced_by_a_dask_scheme_with_a_warning(client):
    with pytest.warns(UserWarning, match="RayWeightSyncScheme moves weights through Ray"):
        collector = collector_for(client, weight_sync_schemes={"policy": RayWeightSyncScheme()})
    with collector:
        batches = iter(collector)
        next(batches)
        collector.update_policy_weights_(weights_of(4.0))
        assert acted(next(batches)) == [{4.0}, {4.0}]


class DoublingUpdater(DaskWeightUpdater):
    """Doubles the weights and skips collector 0: the legacy updater's hooks, overridden."""

    def _maybe_map_weights(self, policy_or_weights):
        return TensorDict.from_module(policy_or_weights).data * 2

    def _skip_update(self, worker_id):
        return worker_id == 0


@pytest.mark.parametrize("collector_class", [Collector, MultiSyncCollector])
def test_a_dask_weight_updater_subclass_maps_skips_and_runs_post_hooks(client, collector_class):
    policy, hooks = CountingPolicy(), []
    updater = DoublingUpdater()
    updater.register_post_hook(lambda: hooks.append(time.monotonic()))
    with collector_for(
        client, policy=policy, weight_updater=updater, collector_class=collector_class
    ) as collector:
        assert collector.weight_updater is updater and updater.collector is collector
        assert updater.all_worker_ids() == [0, 1]
        batches = iter(collector)
        next(batches)
        policy.weight.data += 2
        collector.update_policy_weights_()  # the driver's policy (3), doubled, to collector 1
        assert acted(next(batches)) == [{1.0}, {6.0}]
        assert len(hooks) == 1


class RecordingUpdater(WeightUpdaterBase):
    """A user's own legacy updater: daskcollect calls it as RayCollector does, and it does the rest."""

    def __init__(self):
        self.synced: list[tuple[int, float]] = []

    def all_worker_ids(self):
        return [0, 1]

    def _sync_weights_with_worker(self, *, worker_id=None, server_weights):
        weights = (
            TensorDict.from_module(server_weights)
            if isinstance(server_weights, torch.nn.Module)
            else server_weights
        )
        self.synced.append((worker_id, float(weights["weight"])))


def test_a_users_own_weight_updater_is_called_for_every_update(client):
    updater = RecordingUpdater()
    with collector_for(client, weight_updater=updater, update_after_each_batch=True) as collector:
        batches = iter(collector)
        next(batches)  # update_after_each_batch: the driver's policy (1) to both collectors
        assert sorted(updater.synced) == [(0, 1.0), (1, 1.0)]
        collector.update_policy_weights_(weights_of(9.0))
        assert sorted(updater.synced[2:]) == [(0, 9.0), (1, 9.0)]
        assert acted(next(batches)) == [{1.0}, {1.0}]  # the updater sent nothing to the collectors


def test_the_updater_may_be_given_as_a_class(client):
    with collector_for(client, weight_updater=DaskWeightUpdater) as collector:
        assert isinstance(collector.weight_updater, DaskWeightUpdater)
        batches = iter(collector)
        next(batches)
        collector.update_policy_weights_(weights_of(2.0), worker_ids=0)
        assert acted(next(batches)) == [{2.0}, {1.0}]


@pytest.mark.parametrize(
    "keywords, match",
    [
        ({"weight_sync_schemes": {"policy": DaskWeightSyncScheme()}, "weight_updater": DaskWeightUpdater()},
         "not both"),
        ({"weight_sync_schemes": {"policy": DaskWeightSyncScheme(), "value": DaskWeightSyncScheme()}},
         "the one model DaskCollector syncs"),
        ({"weight_sync_schemes": {}}, "NoWeightSyncScheme"),
        ({"weight_sync_schemes": DaskWeightSyncScheme()}, "must map 'policy'"),
        ({"weight_sync_schemes": {"policy": SharedMemWeightSyncScheme()}}, "cannot reach collectors"),
        ({"weight_updater": RayWeightUpdater(TensorDict(), [])}, "DaskWeightUpdater"),
        ({"weight_updater": object()}, "must be a torchrl WeightUpdaterBase"),
    ],
)  # fmt: skip
def test_keywords_that_cannot_work_are_refused_before_any_cluster_is_touched(keywords, match):
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=match):
        DaskCollector([CountingEnv], CountingPolicy(), frames_per_batch=10, client="tcp://127.0.0.1:9",
                      **keywords)  # fmt: skip
    assert time.monotonic() - started < 5


def test_a_scheme_serves_one_collection_at_a_time(client):
    scheme = DaskWeightSyncScheme()
    with collector_for(client, weight_sync_schemes={"policy": scheme}):
        with pytest.raises(ConfigurationError, match="already serves another collector"):
            collector_for(client, weight_sync_schemes={"policy": scheme})
    with collector_for(client, weight_sync_schemes={"policy": scheme}) as again:  # free once shut down
        batches = iter(again)
        next(batches)
        again.update_policy_weights_(weights_of(3.0))
        assert acted(next(batches)) == [{3.0}, {3.0}]


def test_models_other_than_the_policy_are_refused_at_update(client):
    with collector_for(client) as collector:
        with pytest.raises(ConfigurationError, match="syncs one model"):
            collector.update_policy_weights_(weights_of(2.0), model_id="value")
        with pytest.raises(ConfigurationError, match="syncs one model"):
            collector.update_policy_weights_(weights_dict={"policy": weights_of(2.0), "value": torch.ones(1)})


def test_torchrls_backend_registry_builds_a_dask_scheme():
    scheme = WeightSyncScheme.from_backend("dask", strategy="state_dict")
    assert type(scheme) is DaskWeightSyncScheme and scheme.strategy_str == "state_dict"
