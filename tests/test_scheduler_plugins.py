"""daskcollect.scheduler_plugins: a collection leaves the user's cluster as it found it.

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

import logging
import os
import sys

import dask
from distributed import Client
from helpers import wait_until
from torchrl.data import LazyTensorStorage

from daskcollect import DaskCollector, DaskReplayBuffer
from daskcollect.membership import MEMBERSHIP_PLUGIN, MembershipEvents
from daskcollect.monitoring.dashboard import MONITOR_PLUGIN
from daskcollect.retirement import RETIREMENT_PLUGIN
from daskcollect.scheduler_plugins import Lease
from daskcollect.testing import cartpole_policy, make_cartpole

SHARED = {RETIREMENT_PLUGIN, MEMBERSHIP_PLUGIN, MONITOR_PLUGIN}

#: Set by importing gymnasium (a module, once imported, stays): not the collection's doing.
IMPORT_SIDE_EFFECTS = {"PYGAME_HIDE_SUPPORT_PROMPT"}


def scheduler_state(dask_scheduler) -> dict:
    app = dask_scheduler.http_application
    return {
        "plugins": sorted(dask_scheduler.plugins),
        "handlers": sorted(dask_scheduler.handlers),
        "retire_workers": repr(dask_scheduler.handlers["retire_workers"]),
        "routes": [len(app.default_router.rules), len(app.wildcard_router.rules)],
        "subscriptions": sorted(
            t for t, topic in dask_scheduler._broker._topics.items() if topic.subscribers
        ),
        "tasks": sorted(map(str, dask_scheduler.tasks)),
    }


def worker_state(dask_worker) -> dict:
    return {
        "plugins": sorted(dask_worker.plugins),
        "handlers": sorted(dask_worker.handlers),
        "data": sorted(map(str, dask_worker.data)),
        "actors": sorted(map(str, dask_worker.state.actors)),
        "log filters": [repr(f) for f in logging.getLogger("distributed.worker").filters],
        "environment": {k: v for k, v in os.environ.items() if k not in IMPORT_SIDE_EFFECTS},
        "sys.path": list(sys.path),
        "tick": dask_worker.periodic_callbacks["tick"].callback_time,
    }


def state(client: Client) -> dict:
    return {"scheduler": client.run_on_scheduler(scheduler_state), "workers": client.run(worker_state)}


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
    before = state(client)
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
    wait_until(lambda: state(client) == before, timeout=10)
    assert differences(before, state(client)) == []


def differences(before: dict, after: dict, where: str = "") -> list[str]:
    """What changed, one line per leaf: ``where: before -> after``."""
    out = []
    for key in sorted(set(before) | set(after), key=str):
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{where}/{key}")
        elif isinstance(a, list) and isinstance(b, list) and a != b:
            out.append(
                f"{where}/{key}: removed {[x for x in a if x not in b]}, added {[x for x in b if x not in a]}"
                + ("" if sorted(map(str, a)) != sorted(map(str, b)) else " (order)")
            )
        elif a != b:
            out.append(f"{where}/{key}: {a!r} -> {b!r}")
    return out


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
        return MEMBERSHIP_PLUGIN in client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.plugins)
        )

    with Client(cluster, set_as_default=False) as driver:
        Lease(driver, MembershipEvents(), timeout=10)  # never released: the driver's client closes
        assert installed()
    assert wait_until(lambda: not installed(), timeout=10)
