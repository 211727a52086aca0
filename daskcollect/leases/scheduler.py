"""The scheduler's side of leases: :class:`SharedPlugin` and the functions the driver runs on the scheduler.

Runs on the scheduler (``Client.run_on_scheduler``); it imports nothing heavy.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskcollect import _internals

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
        if gone:
            # A driver that died without closing leaves its event subscriptions: Dask never drops them.
            _internals.forget_subscriber(scheduler, client)
        if details:
            self.orphaned(scheduler, details)
        if gone and not self.leases:
            # Dask is iterating over its plugins: remove this one on the next turn of the loop.
            self._removal = asyncio.ensure_future(remove_unused(scheduler, self))

    def orphaned(self, scheduler: Any, details: list[Any]) -> None:
        """Called when a client disconnected without releasing leases; ``details`` are theirs."""


class HandlerPlugin(SharedPlugin):
    """A shared plugin that wraps one of the scheduler's RPC handlers while it is installed.

    Subclasses set ``handler`` (the RPC's name) and implement :meth:`handle`,
    which may call Dask's own handler as ``self.original``. ``close()`` puts
    Dask's handler back. Only the first instance wraps it: a second one finds
    the wrapper already there.
    """

    handler: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.scheduler: Any = None
        self.original: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        current = _internals.scheduler_handler(scheduler, self.handler)
        if getattr(current, "daskcollect", False):
            return  # another instance already wrapped it
        self.original = current

        async def wrapped(**kwargs: Any) -> Any:
            return await self.handle(kwargs)

        wrapped.daskcollect = True  # type: ignore[attr-defined]
        _internals.set_scheduler_handler(scheduler, self.handler, wrapped)

    async def close(self) -> None:
        if self.scheduler is not None and self.original is not None:
            _internals.set_scheduler_handler(self.scheduler, self.handler, self.original)
            self.original = None

    async def handle(self, kwargs: dict[str, Any]) -> Any:
        """Answers the RPC in Dask's place; ``kwargs`` as the handler got them."""
        raise NotImplementedError


async def remove_unused(scheduler: Any, plugin: SharedPlugin) -> None:
    """Closes and removes ``plugin`` from ``scheduler`` if no lease holds it (on the scheduler's loop)."""
    if plugin.leases or _internals.scheduler_plugin(scheduler, plugin.name) is not plugin:
        return  # taken again meanwhile, or already gone
    try:
        closed = plugin.close()
        if inspect.isawaitable(closed):
            await closed
    finally:
        _internals.remove_scheduler_plugin(scheduler, plugin.name)


async def acquire(
    plugin: SharedPlugin, lease: str, client: str, detail: Any = None, dask_scheduler: Any = None
) -> int:
    """Installs ``plugin`` unless the scheduler has one of its name, and records ``lease``, held by
    the client ``client``, with ``detail`` for the plugin (run on the scheduler:
    ``Client.run_on_scheduler``).

    Returns:
        How many leases the plugin now has.
    """
    current = _internals.scheduler_plugin(dask_scheduler, plugin.name)
    if not isinstance(current, SharedPlugin):
        await _internals.add_scheduler_plugin(dask_scheduler, plugin, plugin.name)
        current = plugin
    current.leases[lease] = client
    if detail is not None:
        current.details[lease] = detail
    return len(current.leases)


def set_detail(name: str, lease: str, detail: Any, dask_scheduler: Any = None) -> bool:
    """Replaces what ``lease`` on the plugin ``name`` was registered with (run on the scheduler);
    ``False`` if the lease is gone."""
    current = _internals.scheduler_plugin(dask_scheduler, name)
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
    current = _internals.scheduler_plugin(dask_scheduler, name)
    if not isinstance(current, SharedPlugin):
        return 0
    current.leases.pop(lease, None)
    current.details.pop(lease, None)
    if not current.leases:
        await remove_unused(dask_scheduler, current)
    return len(current.leases)
