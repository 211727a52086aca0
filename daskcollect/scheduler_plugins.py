"""Scheduler plugins shared by collections, and removed with the last one that uses them.

daskcollect installs a few plugins on the scheduler (graceful retirement, worker
joins, the dashboard's monitor). A scheduler may serve several collections at
once, from one driver or several, and it is often a cluster shared with other
work: a plugin must be there while any collection uses it and gone, with what
it changed undone, once none does.

Each collection holds a *lease* on each plugin. :func:`acquire` installs the
plugin if the scheduler has none of that name and records the lease;
:func:`release_lease` drops it, and the last lease out closes the plugin (its
``close`` undoes what its ``start`` changed) and removes it. A driver that
dies without releasing is covered too: when its ``Client`` disconnects, the
plugin drops that client's leases the same way. Both run on the scheduler's
event loop (``Client.run_on_scheduler``), so an acquire and a release never
interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

logger = logging.getLogger(__name__)


class SharedPlugin(SchedulerPlugin):
    """A scheduler plugin held by leases: installed by the first, removed after the last.

    Subclasses set ``name`` and undo in ``close`` what ``start`` changed.
    """

    name: str = "daskcollect-shared"

    def __init__(self) -> None:
        #: lease id -> the id of the client that holds it.
        self.leases: dict[str, str] = {}
        #: lease id -> what its holder registered it with (see :func:`acquire`).
        self.details: dict[str, Any] = {}
        self._removal: asyncio.Future | None = None

    def remove_client(self, scheduler: Any, client: str) -> None:
        gone = [lease for lease, holder in self.leases.items() if holder == client]
        details = [self.details.pop(lease) for lease in gone if lease in self.details]
        for lease in gone:
            del self.leases[lease]
        if details:
            self.orphaned(scheduler, details)
        if gone and not self.leases:
            # Dask is iterating over its plugins: remove this one on the next turn of the loop.
            self._removal = asyncio.ensure_future(remove_unused(scheduler, self))

    def orphaned(self, scheduler: Any, details: list[Any]) -> None:
        """Called when a client disconnected without releasing leases; ``details`` are theirs."""


async def remove_unused(scheduler: Any, plugin: SharedPlugin) -> None:
    """Closes and removes ``plugin`` from ``scheduler`` if no lease holds it (on the scheduler's loop)."""
    if plugin.leases or scheduler.plugins.get(plugin.name) is not plugin:
        return  # taken again meanwhile, or already gone
    try:
        closed = plugin.close()
        if inspect.isawaitable(closed):
            await closed
    finally:
        scheduler.remove_plugin(name=plugin.name)


async def acquire(
    plugin: SharedPlugin, lease: str, client: str, detail: Any = None, dask_scheduler: Any = None
) -> int:
    """Installs ``plugin`` unless the scheduler has one of its name, and records ``lease``, held by
    the client ``client``, with ``detail`` for the plugin (run on the scheduler:
    ``Client.run_on_scheduler``).

    Returns:
        How many leases the plugin now has.
    """
    current = dask_scheduler.plugins.get(plugin.name)
    if not isinstance(current, SharedPlugin):
        await dask_scheduler.register_scheduler_plugin(plugin, name=plugin.name, idempotent=False)
        current = plugin
    current.leases[lease] = client
    if detail is not None:
        current.details[lease] = detail
    return len(current.leases)


def set_detail(name: str, lease: str, detail: Any, dask_scheduler: Any = None) -> bool:
    """Replaces what ``lease`` on the plugin ``name`` was registered with (run on the scheduler);
    ``False`` if the lease is gone."""
    current = dask_scheduler.plugins.get(name)
    if not isinstance(current, SharedPlugin) or lease not in current.leases:
        return False
    current.details[lease] = detail
    return True


async def release_lease(name: str, lease: str, dask_scheduler: Any = None) -> int:
    """Drops ``lease`` on the plugin ``name``; the last one out closes and removes the plugin (run
    on the scheduler).

    Returns:
        How many leases are left.
    """
    current = dask_scheduler.plugins.get(name)
    if not isinstance(current, SharedPlugin):
        return 0
    current.leases.pop(lease, None)
    current.details.pop(lease, None)
    if not current.leases:
        await remove_unused(dask_scheduler, current)
    return len(current.leases)


class Lease:
    """One collection's hold on a shared scheduler plugin.

    Args:
        client: The collection's ``Client``.
        plugin: The plugin to install if the scheduler has none of its name.
        timeout: Bound on each call to the scheduler.
        detail: What the plugin keeps with this lease (picklable).

    Raises:
        Exception: What the scheduler raised: typically that it cannot import
            daskcollect (not installed beside it). Nothing is then held.
    """

    def __init__(self, client: Any, plugin: SharedPlugin, timeout: float, detail: Any = None):
        self.client, self.name, self.timeout = client, plugin.name, timeout
        self.id = f"{plugin.name}-{uuid.uuid4().hex[:12]}"
        client.run_on_scheduler(acquire, plugin, self.id, client.id, detail, callback_timeout=timeout)
        self._held = True

    def update(self, detail: Any) -> None:
        """Replaces what the plugin keeps with this lease.

        Raises:
            Exception: What the scheduler raised, or a timeout.
        """
        self.client.run_on_scheduler(set_detail, self.name, self.id, detail, callback_timeout=self.timeout)

    def release(self) -> None:
        """Gives the lease back (idempotent); the last one removes the plugin. A scheduler that
        is gone or does not answer in time is left: its client's disconnect releases the lease."""
        if not self._held:
            return
        self._held = False
        if self.client.status != "running":  # no scheduler to ask: the disconnect releases it
            return
        with contextlib.suppress(Exception):
            self.client.run_on_scheduler(release_lease, self.name, self.id, callback_timeout=self.timeout)


def lease(client: Any, plugin: SharedPlugin, timeout: float, detail: Any = None) -> Lease | None:
    """A :class:`Lease` on ``plugin``, or ``None`` where the scheduler cannot load it (logged)."""
    try:
        return Lease(client, plugin, timeout, detail)
    except Exception as exc:
        logger.debug("scheduler plugin %s not installed: %s: %s", plugin.name, type(exc).__name__, exc)
        return None
