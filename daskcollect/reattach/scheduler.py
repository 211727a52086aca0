"""What a driver that dies leaves on a user's cluster, removed by the scheduler, now or after a grace period.

Runs on the scheduler (the driver leases it: :func:`daskcollect.reattach.driver.hold_plugins`).

A driver that shuts down removes its worker plugins itself (``WorkerSetup``,
the ``py_modules`` uploads); their teardown restores the workers. A driver
that is killed (SIGKILL, a node lost, a job past its walltime) cannot. Its
actors go with its ``Client`` (Dask forgets the futures of a client that
disconnects), but worker plugins are the scheduler's, and stay.

:class:`OrphanSweeper` is a shared scheduler plugin: each collection on a
cluster it did not start holds a lease on it that names its worker plugins
(:class:`Held`). When the collection's ``Client`` disconnects without
releasing the lease, the sweeper unregisters those plugins, so their teardown
runs on every worker.

A collection that re-attaching covers (``daskcollect.reattach.grace-period``,
:mod:`daskcollect.reattach.driver`) has published its actors as a Dask dataset,
which keeps them alive without its client. Its lease names the dataset and
the grace period: the sweeper waits that long, then unpublishes the dataset
(its actors go) and unregisters the plugins. A new driver that claims the
collection within the period (:func:`claim_run`) stops the wait, and its own
lease names what to remove from then on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from daskcollect import _internals
from daskcollect.leases.scheduler import SharedPlugin, remove_unused

logger = logging.getLogger(__name__)

ORPHAN_PLUGIN = "daskcollect-orphans"
#: The holder of the leases that keep the sweeper installed while a collection waits out its grace period.
GRACE_HOLDER = "daskcollect-grace-period"


@dataclass(frozen=True)
class Held:
    """What a collection's lease on the sweeper names.

    Attributes:
        plugins: Its worker plugins, removed once it is orphaned.
        run: The dataset its actors are published under, or ``None``.
        grace: Seconds an orphaned ``run`` waits for a new driver; ``None``: none.
    """

    plugins: tuple[str, ...] = ()
    run: str | None = None
    grace: float | None = None


class OrphanSweeper(SharedPlugin):
    """Removes what collections whose driver disconnected without closing left, after their grace period."""

    name = ORPHAN_PLUGIN

    def __init__(self) -> None:
        super().__init__()
        self._sweeps: set[asyncio.Task] = set()
        self._waiting: dict[str, asyncio.TimerHandle] = {}  # run -> the end of its grace period

    def orphaned(self, scheduler: Any, details: list[Any]) -> None:
        for held in details:
            if held.run is not None and self.holds(held.run):
                continue  # a new driver took it over: its lease names what to remove
            if held.run is not None and held.grace:
                self.leases[GRACE_HOLDER + held.run] = GRACE_HOLDER  # stays installed meanwhile
                expire = asyncio.get_running_loop().call_later(held.grace, self._expire, scheduler, held)
                self._waiting[held.run] = expire
                logger.info(
                    "collection %s orphaned: its collectors wait %gs for a new driver", held.run, held.grace
                )
            else:
                self._start_sweep(scheduler, held)

    def holds(self, run: str) -> bool:
        """Whether a driver's lease names ``run``."""
        return any(held.run == run for held in self.details.values())

    def stop_waiting(self, run: str) -> bool:
        """Ends ``run``'s grace period without removing anything; ``False`` if it was not waiting."""
        expire = self._waiting.pop(run, None)
        if expire is None:
            return False
        expire.cancel()
        self.leases.pop(GRACE_HOLDER + run, None)
        return True

    def _expire(self, scheduler: Any, held: Held) -> None:
        self.stop_waiting(held.run)
        logger.info("collection %s: no driver came back within %gs; removing it", held.run, held.grace)
        self._start_sweep(scheduler, held)

    def _start_sweep(self, scheduler: Any, held: Held) -> None:
        task = asyncio.ensure_future(_sweep(scheduler, held, self))
        self._sweeps.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._sweeps.discard)


async def _sweep(scheduler: Any, held: Held, sweeper: OrphanSweeper) -> None:
    if held.run is not None and _internals.drop_dataset(scheduler, held.run):
        logger.info("released the collectors of %s", held.run)  # unpublished: their actors go
    for name in held.plugins:
        if name not in _internals.registered_worker_plugins(scheduler):
            continue
        try:
            await _internals.unregister_worker_plugin(scheduler, name)
            logger.info("removed worker plugin %s of a driver that disconnected", name)
        except Exception as exc:  # a worker that fails its teardown must not stop the others'
            logger.warning("could not remove worker plugin %s: %s: %s", name, type(exc).__name__, exc)
    if not sweeper.leases:
        await remove_unused(scheduler, sweeper)  # the last grace period ended: nothing holds it


def claim_run(run: str, lease_id: str, dask_scheduler: Any = None) -> str:
    """Takes over collection ``run`` for the holder of ``lease_id`` (run on the scheduler).

    Returns:
        ``"live"``: another connected client's lease holds it; ``"held"``:
        its actors are published and now this lease's (a grace period, if
        running, is over); ``"gone"``: nothing of it is left.
    """
    sweeper = _internals.scheduler_plugin(dask_scheduler, ORPHAN_PLUGIN)
    if not isinstance(sweeper, OrphanSweeper):
        return "gone"
    others = [
        sweeper.leases.get(i) for i, held in sweeper.details.items() if held.run == run and i != lease_id
    ]
    if set(others) & _internals.connected_clients(dask_scheduler):
        return "live"
    sweeper.stop_waiting(run)
    return "held" if run in _internals.published_datasets(dask_scheduler) else "gone"
