"""daskcollect.reattach.scheduler: the worker plugins of a driver that disconnects without closing are removed."""

from __future__ import annotations

import time

import pytest
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from helpers import wait_until

from daskcollect.reattach.driver import hold_plugins
from daskcollect.reattach.scheduler import ORPHAN_PLUGIN, claim_run


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


def datasets(client) -> list[str]:
    return [str(name) for name in client.list_datasets(callback_timeout=30)]


@pytest.mark.parametrize("claimed", [True, False])
def test_an_orphaned_run_waits_out_its_grace_period_unless_a_driver_claims_it(client, claimed):
    driver = Client(client.scheduler.address, set_as_default=False)
    run = f"daskcollect-run-test-{claimed}"
    try:
        driver.register_plugin(Left(), name="daskcollect-test-waiting")
        driver.publish_dataset(driver.submit(int, 3, pure=False), name=run)
        assert hold_plugins(driver, ["daskcollect-test-waiting"], timeout=30, run=run, grace=3) is not None
    finally:
        driver.close()
    # Orphaned: the run and the plugins stay for the grace period.
    assert run in datasets(client) and "daskcollect-test-waiting" in worker_plugins(client)
    if claimed:  # a live driver's lease takes them over, for good
        taker = hold_plugins(client, ["daskcollect-test-waiting"], timeout=30, run=run)
        assert client.run_on_scheduler(claim_run, run, taker.id, callback_timeout=30) == "held"
        time.sleep(4)  # past the grace period
        assert run in datasets(client) and "daskcollect-test-waiting" in worker_plugins(client)
        client.unpublish_dataset(run)
        client.unregister_worker_plugin("daskcollect-test-waiting")
        taker.release()
    else:
        wait_until(lambda: run not in datasets(client), timeout=30)
        wait_until(lambda: "daskcollect-test-waiting" not in worker_plugins(client), timeout=30)
        assert client.run_on_scheduler(claim_run, run, "no-lease", callback_timeout=30) == "gone"
    wait_until(lambda: ORPHAN_PLUGIN not in scheduler_plugins(client), timeout=30)
    assert ORPHAN_PLUGIN not in scheduler_plugins(client) and run not in datasets(client)
