"""daskcollect.leases: a collection leaves the user's cluster as it found it.

The cluster's state (the scheduler's plugins, handlers, dashboard routes, event
subscriptions and tasks; each worker's plugins, handlers, data, actors, log
filters, environment, ``sys.path`` and event-loop tick) is read before a
collection and after it, on an external scheduler (the session's cluster) and
on a user's own ``LocalCluster``, around a sync and an async collection and one
that feeds a ``DaskReplayBuffer``: the two are equal. Shared plugins stay while
any collection holds a lease, and go with the last one, or with a driver that
disconnects without giving its lease back.
"""

from __future__ import annotations

import dask
from distributed import Client
from helpers import wait_until
from makers import cartpole_policy, make_cartpole
from torchrl.data import LazyTensorStorage

from daskcollect import DaskCollector, DaskReplayBuffer
from daskcollect.leases.driver import Lease
from daskcollect.monitoring.scheduler import MONITOR_PLUGIN, CollectorMonitor
from daskcollect.retirement import RETIREMENT_PLUGIN
from daskcollect.testing import cluster_state, differences

SHARED = {RETIREMENT_PLUGIN, MONITOR_PLUGIN}


def collect(client: Client, sync: bool) -> int:
    frames = 0
    with DaskCollector(
        make_cartpole, cartpole_policy(), frames_per_batch=40, total_frames=200, num_collectors=2, sync=sync,
        client=client, worker_env={"DASKCOLLECT_TEST_FLAG": "1"},
    ) as collector:  # fmt: skip
        for i, batch in enumerate(collector):
            frames += batch.numel()
            if i == 0:
                collector.update_policy_weights_()
    return frames


def check_unchanged(client: Client) -> None:
    before = cluster_state(client)
    with dask.config.set(
        {"daskcollect.weights.shared-memory": False}
    ):  # the Dask route: the workers hold copies
        assert collect(client, sync=True) == 200
        assert collect(client, sync=False) == 200
    with DaskReplayBuffer(storage=LazyTensorStorage(1000), batch_size=8, client=client) as rb:
        with DaskCollector(
            make_cartpole, frames_per_batch=50, total_frames=200, num_collectors=2, replay_buffer=rb,
            client=client,
        ) as collector:  # fmt: skip
            assert list(collector) == [None] * 4
        assert len(rb) == 200
    wait_until(lambda: cluster_state(client) == before, timeout=10)
    assert differences(before, cluster_state(client)) == []


def test_an_external_scheduler_is_left_as_found(client):
    check_unchanged(client)


def test_a_users_local_cluster_is_left_as_found(make_cluster):
    with Client(make_cluster(n_workers=2), set_as_default=False) as client:
        check_unchanged(client)


def test_the_plugins_stay_while_a_collection_holds_them_and_go_with_the_last(client):
    def plugins() -> set[str]:
        return set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))) & SHARED

    first = DaskCollector(
        make_cartpole, None, frames_per_batch=40, total_frames=-1, num_collectors=1, client=client
    )
    try:
        second = DaskCollector(
            make_cartpole, None, frames_per_batch=40, total_frames=-1, num_collectors=1, client=client
        )
        with second:
            assert plugins() == {RETIREMENT_PLUGIN, MONITOR_PLUGIN}
            first.shutdown()
            assert plugins() == {RETIREMENT_PLUGIN, MONITOR_PLUGIN}  # the second still uses them
            assert next(iter(second)).numel() == 40
    finally:
        first.shutdown()
    assert plugins() == set()


def test_a_driver_gone_without_releasing_gives_its_lease_back(cluster, client):
    def installed() -> bool:
        return MONITOR_PLUGIN in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))

    with Client(cluster, set_as_default=False) as driver:
        Lease(driver, CollectorMonitor(), timeout=10)  # never released: the driver's client closes
        assert installed()
    assert wait_until(lambda: not installed(), timeout=10)
