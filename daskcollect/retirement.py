"""Graceful retirement of workers that host collectors: a scheduler plugin.

Dask refuses to retire a worker that holds an actor (an actor cannot move), and
``SpecCluster.scale`` down, ``Adaptive``, ``Client.retire_workers`` and a
worker's ``--lifetime`` all go through ``Scheduler.retire_workers``. A refused
retirement of a scaled-down worker is followed by a plain close, so the
collector's rollout in flight would be lost.

:class:`GracefulRetirement` wraps the scheduler's ``retire_workers`` handler.
Before Dask's own retirement starts, it announces the leaving workers on the
:data:`RETIRING_TOPIC` event topic and waits (bounded by
``daskcollect.timeouts.retire``) until every daskcollect actor on them has been
released. On the driver, each collection's :class:`RetirementWatcher` listens
on that topic: it stops calls to those collectors, lets the calls in flight
finish (their batches are yielded as usual), closes the collectors and
releases the actors, and hands the released slots to the engine, which counts
them and reconciles. Dask's retirement then proceeds as for any worker.
Without daskcollect actors on the leaving workers, the call goes to Dask's own
handler unchanged. A collector's worker that retires itself (``--lifetime``) is
removed from the scheduler when it disconnects rather than at once, so that a
heartbeat racing its close cannot make it close its nanny too
(``--lifetime-restart`` workers then come back every time).

The plugin is shared by the collections on a scheduler
(:mod:`daskcollect.scheduler_plugins`): the last one to close removes it, and
Dask's handler is back as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from typing import TYPE_CHECKING, Any

from daskcollect import _internals
from daskcollect.polling import apoll_until, poll_until
from daskcollect.scheduler_plugins import Lease, SharedPlugin

if TYPE_CHECKING:  # the pool loads torch; the scheduler unpickling the plugin must not
    from daskcollect.pool import ActorPool, Slot

logger = logging.getLogger(__name__)

#: The key prefix of every daskcollect actor (the pool names them), by which
#: the scheduler plugin tells them from other actors.
ACTOR_KEY_PREFIX = "daskcollect-actor-"

RETIRING_TOPIC = "daskcollect-retiring"
RETIREMENT_PLUGIN = "daskcollect-graceful-retirement"


def collector_actors(scheduler: Any, address: str) -> list[str]:
    """Keys of the daskcollect actors that the worker at ``address`` holds."""
    return [k for k in _internals.actor_keys(scheduler, address) if k.startswith(ACTOR_KEY_PREFIX)]


def _named(name: str, wanted: set[str]) -> bool:
    """Whether a worker is one of ``wanted``, or one of the processes of a job named in it.

    dask-jobqueue names the workers of a multi-process job ``<job>-<i>`` and
    scales down by job name.
    """
    return name in wanted or name.rsplit("-", 1)[0] in wanted


class GracefulRetirement(SharedPlugin):
    """Lets daskcollect release its actors before Dask retires their workers.

    Leased by every ``DaskCollector``. With no collector actor on the leaving
    workers it hands the call to Dask's handler unchanged. ``close()`` restores
    Dask's handler.

    Args:
        timeout: How long a retirement waits for the collectors' release
            (``daskcollect.timeouts.retire`` of the first collection that registered it).
    """

    name = RETIREMENT_PLUGIN

    def __init__(self, timeout: float = 60.0) -> None:
        super().__init__()
        self.timeout = timeout
        self._scheduler: Any = None
        self._original: Any = None

    async def start(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        current = _internals.retire_handler(scheduler)
        if getattr(current, "_daskcollect", False):
            return  # another instance already wrapped it
        self._original = current

        async def retire_workers(**kwargs: Any) -> Any:
            return await self._retire(kwargs)

        retire_workers._daskcollect = True  # type: ignore[attr-defined]
        _internals.set_retire_handler(scheduler, retire_workers)

    async def close(self) -> None:
        if self._scheduler is not None and self._original is not None:
            _internals.set_retire_handler(self._scheduler, self._original)
            self._original = None

    def _targets(self, kwargs: dict[str, Any]) -> list[str]:
        """The addresses Dask's ``retire_workers`` would retire for these arguments."""
        scheduler = self._scheduler
        # SpecCluster.scale passes worker *names* as workers=: Dask then retires
        # nothing and closes them anyway, so names count here too.
        given = kwargs.get("workers") if kwargs.get("workers") is not None else kwargs.get("names")
        if given is not None:
            wanted = {str(w) for w in given}
            names = _internals.worker_addresses_by_name(scheduler)
            return [a for a, name in names.items() if a in wanted or _named(name, wanted)]
        return _internals.workers_to_close(scheduler, kwargs.get("n"), kwargs.get("memory_ratio"))

    async def _retire(self, kwargs: dict[str, Any]) -> Any:
        scheduler = self._scheduler
        kwargs.pop("comm", None)
        targets = self._targets(kwargs)
        busy = [a for a in targets if collector_actors(scheduler, a)]
        if busy:
            if kwargs.get("workers") is None and kwargs.get("names") is None:
                # Retire exactly the workers announced, not a new choice after the wait.
                kwargs = {k: v for k, v in kwargs.items() if k not in ("n", "memory_ratio")}
                kwargs["workers"] = targets
            scheduler.log_event(RETIRING_TOPIC, {"workers": busy})
            released = await apoll_until(
                lambda: not any(collector_actors(scheduler, a) for a in busy), self.timeout
            )
            if not released:
                logger.warning(
                    "daskcollect: collectors on %s were not released within %gs "
                    "(daskcollect.timeouts.retire); Dask will refuse to retire those workers",
                    busy,
                    self.timeout,
                )
        if busy and _internals.is_self_retirement(kwargs):
            # Dask removes the worker at once, before the worker closes; a heartbeat
            # in between is answered "missing", and the worker then closes its
            # nanny too, so a --lifetime-restart worker never comes back
            # (dask/distributed#4752). Removed when it disconnects, it cannot race.
            kwargs["remove"] = False
        return await self._original(**kwargs)


def install_retirement_hook(client: Any, timeout: float) -> Lease | None:
    """Leases :class:`GracefulRetirement` on the client's scheduler (installed by the first lease).

    Returns:
        The lease, to release when the collection closes; ``None``, with a
        warning, where the scheduler cannot load the plugin (daskcollect not
        installed beside the scheduler): retiring a collector's worker then
        loses the rollout in flight, as a lost worker does.
    """
    try:
        return Lease(client, GracefulRetirement(timeout), timeout=timeout)
    except Exception as exc:
        warnings.warn(
            f"daskcollect could not install its retirement hook on the scheduler ({type(exc).__name__}: "
            f"{exc}). Workers that retire gracefully will lose their collector's rollout in flight. "
            "Install daskcollect in the scheduler's environment to avoid it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


class RetirementWatcher:
    """The driver's side: stops calls to collectors on retiring workers and releases their actors.

    Runs on the client's event loop (the topic's handler and the completion
    callbacks); the iteration thread collects the released slots with
    :meth:`take_retired`.

    Args:
        client: Our ``Client``.
        pool: The collection's pool.
        timeout: Bound on closing one actor, and on :meth:`take_retired`'s wait.
    """

    def __init__(self, client: Any, pool: ActorPool, timeout: float):
        self.client, self.pool, self.timeout = client, pool, timeout
        pool.on_retiring_call_done = self.release_if_idle
        client.subscribe_topic(RETIRING_TOPIC, self._on_retiring)

    async def _on_retiring(self, event: tuple[float, dict]) -> None:
        """Handles the scheduler plugin's announcement of workers about to retire."""
        _, msg = event
        addresses = set(msg.get("workers", ()))
        with self.pool.lock:
            self.pool.retiring_workers |= addresses
        for slot in self._mark(addresses):
            await self.release_if_idle(slot)

    def _mark(self, addresses: set[str]) -> list[Slot]:
        slots = [s for s in self.pool.slots if s.address in addresses and not s.retiring]
        with self.pool.lock:  # submit() reads the flag under it
            for slot in slots:
                slot.retiring = True
        return slots

    def adopt(self, slots: list[Slot]) -> None:
        """Marks new slots whose worker began retiring while they were being built."""
        for slot in self._mark({s.address for s in slots} & self.pool.retiring_workers):
            self.client.loop.add_callback(self.release_if_idle, slot)

    async def release_if_idle(self, slot: Slot) -> None:
        """Closes and releases a retiring slot's actor once no call of it runs."""
        running = {f.slot for f in self.pool.running()}
        with self.pool.lock:
            if slot.retired or slot in running:
                return
            slot.retired = True
        try:
            await asyncio.wait_for(slot.actor.close(), self.timeout)
        except Exception as exc:  # the worker may already be closing: releasing is what matters
            logger.debug("closing retiring collector %d: %s", slot.index, exc)
        await _internals.cancel(self.client, [slot.future], reason="daskcollect: worker retiring")
        logger.info("collector %d released: its worker %s is retiring", slot.index, slot.address)

    def take_retired(self, wait: bool) -> list[Slot]:
        """Removes and returns the slots released for a graceful retirement.

        Args:
            wait: Also wait (bounded) for retiring slots with no call running
                to be released, so that none is left half-way (sync mode).
        """
        if wait:

            def settled() -> bool:
                busy = {f.slot for f in self.pool.running()}
                return not any(s.retiring and not s.retired and s not in busy for s in self.pool.slots)

            poll_until(settled, self.timeout, interval=0.02)
        return self.pool.take_retired()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(RETIRING_TOPIC)
