"""What a driver that dies leaves on a user's cluster, removed by the scheduler.

A driver that shuts down removes its worker plugins itself (``WorkerSetup``,
the ``py_modules`` uploads); their teardown restores the workers. A driver
that is killed (SIGKILL, a node lost, a job past its walltime) cannot. Its
actors go with its ``Client`` (Dask forgets the futures of a client that
disconnects), but worker plugins are the scheduler's, and stay.

:class:`OrphanSweeper` is a shared scheduler plugin: each collection on a
cluster it did not start holds a lease on it that names its worker plugins.
When the collection's ``Client`` disconnects without releasing the lease, the
sweeper unregisters those plugins, so their teardown runs on every worker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from daskcollect.scheduler_plugins import Lease, SharedPlugin, lease

logger = logging.getLogger(__name__)

ORPHAN_PLUGIN = "daskcollect-orphans"


class OrphanSweeper(SharedPlugin):
    """Unregisters the worker plugins of collections whose driver disconnected without closing."""

    name = ORPHAN_PLUGIN

    def __init__(self) -> None:
        super().__init__()
        self._sweeps: set[asyncio.Task] = set()

    def orphaned(self, scheduler: Any, details: list[Any]) -> None:
        names = [name for plugin_names in details for name in plugin_names]
        task = asyncio.ensure_future(_sweep(scheduler, names))
        self._sweeps.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._sweeps.discard)


async def _sweep(scheduler: Any, names: list[str]) -> None:
    for name in names:
        if name not in scheduler.worker_plugins:
            continue
        try:
            await scheduler.unregister_worker_plugin(None, name)
            logger.info("removed worker plugin %s of a driver that disconnected", name)
        except Exception as exc:  # a worker that fails its teardown must not stop the others'
            logger.warning("could not remove worker plugin %s: %s: %s", name, type(exc).__name__, exc)


def hold_plugins(client: Any, names: list[str], timeout: float) -> Lease | None:
    """A lease that has the scheduler remove the worker plugins ``names`` if this driver dies.

    ``None`` where the scheduler cannot load daskcollect (logged): the plugins
    of a killed driver then stay until removed by hand.
    """
    return lease(client, OrphanSweeper(), timeout, detail=list(names))
