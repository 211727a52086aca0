"""The driver's side of graceful retirement: the lease on the scheduler plugin and :class:`RetirementWatcher`.

Runs on the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from typing import TYPE_CHECKING, Any

from daskcollect import _internals
from daskcollect.leases.driver import Lease
from daskcollect.retirement import RETIRING_TOPIC
from daskcollect.retirement.scheduler import GracefulRetirement

if TYPE_CHECKING:  # the pool loads torch
    from daskcollect.collection.build import Slot
    from daskcollect.collection.pool import ActorPool

logger = logging.getLogger(__name__)


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
        for slot in self.pool.mark_retiring(set(msg.get("workers", ()))):
            await self.release_if_idle(slot)

    def adopt(self, slots: list[Slot]) -> None:
        """Marks new slots whose worker began retiring while they were being built."""
        for slot in self.pool.mark_retiring(set(), slots):
            self.client.loop.add_callback(self.release_if_idle, slot)

    async def release_if_idle(self, slot: Slot) -> None:
        """Closes and releases a retiring slot's actor once no call of it runs."""
        if not self.pool.claim_release(slot):
            return
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
            self.pool.wait_released(self.timeout)
        return self.pool.take_retired()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(RETIRING_TOPIC)
