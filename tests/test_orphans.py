"""daskcollect.orphans: the worker plugins of a driver that disconnects without closing are removed."""

from __future__ import annotations

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from helpers import wait_until

from daskcollect.orphans import ORPHAN_PLUGIN, hold_plugins


class Left(WorkerPlugin):
    """What a killed driver's collection would leave on the workers."""


def worker_plugins(client) -> set[str]:
    return set().union(
        *client.run(lambda dask_worker: list(dask_worker.plugins), callback_timeout=30).values()
    )


def scheduler_plugins(client) -> set[str]:
    return set(
        client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins), callback_timeout=30)
    )


def test_a_drivers_worker_plugins_go_when_its_client_leaves_without_releasing(client):
    driver = Client(client.scheduler.address, set_as_default=False)
    try:
        driver.register_plugin(Left(), name="daskcollect-test-left")
        assert hold_plugins(driver, ["daskcollect-test-left"], timeout=30) is not None
        assert "daskcollect-test-left" in worker_plugins(client)
        assert ORPHAN_PLUGIN in scheduler_plugins(client)
    finally:
        driver.close()  # as a killed driver's connection does: the lease is never released
    wait_until(lambda: "daskcollect-test-left" not in worker_plugins(client), timeout=30)
    wait_until(lambda: ORPHAN_PLUGIN not in scheduler_plugins(client), timeout=30)


def test_a_driver_that_releases_keeps_nothing_swept(client):
    driver = Client(client.scheduler.address, set_as_default=False)
    try:
        held = hold_plugins(driver, ["daskcollect-test-kept"], timeout=30)
        driver.register_plugin(Left(), name="daskcollect-test-kept")
        held.release()
        assert ORPHAN_PLUGIN not in scheduler_plugins(client)
        driver.unregister_worker_plugin("daskcollect-test-kept")
    finally:
        driver.close()
    assert "daskcollect-test-kept" not in worker_plugins(client)
