"""Worker joins, from the scheduler's own events: a scheduler plugin and the driver's flag.

A collection that follows the cluster gives each joining worker a collector.
Asking the scheduler for its workers at every batch would cost the driver one
RPC per batch; instead :class:`MembershipEvents`, a scheduler plugin, logs
each join on :data:`JOINED_TOPIC`, and :class:`JoinWatch`, on the driver,
turns those events into a flag that the engine reads once per batch. Where the
scheduler cannot load the plugin (daskcollect not installed beside it), the
watch says "look" once per ``daskcollect.liveness-interval`` instead.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from daskcollect.scheduler_plugins import SharedPlugin, lease

JOINED_TOPIC = "daskcollect-worker-joined"
MEMBERSHIP_PLUGIN = "daskcollect-membership"

#: Even with events, look this many liveness intervals apart: an event logged
#: before the subscription reached the scheduler is not delivered.
SAFETY_INTERVALS = 10


class MembershipEvents(SharedPlugin):
    """Logs every worker that joins on :data:`JOINED_TOPIC` (leased by each collection that follows
    the cluster; the last one out removes it)."""

    name = MEMBERSHIP_PLUGIN

    def add_worker(self, scheduler: Any, worker: str) -> None:
        scheduler.log_event(JOINED_TOPIC, {"worker": worker})


class JoinWatch:
    """The driver's side: whether a worker may have joined since the last look.

    Args:
        client: Our ``Client``.
        interval: ``daskcollect.liveness-interval``: how often to look without events.
    """

    def __init__(self, client: Any, interval: float, timeout: float = 30.0):
        self.client, self.interval = client, interval
        self._joined = True  # look once at the start
        self._next_look = 0.0
        self._lease = lease(client, MembershipEvents(), timeout)
        self.events = self._lease is not None  # else the scheduler cannot import daskcollect: a timer
        if self.events:
            client.subscribe_topic(JOINED_TOPIC, self._on_join)

    def _on_join(self, event: tuple[float, dict]) -> None:
        self._joined = True

    def maybe_joined(self) -> bool:
        """``True`` when it is time to look at the scheduler's workers (resets the flag)."""
        now = time.monotonic()
        joined, self._joined = self._joined, False
        if joined or now >= self._next_look:
            self._next_look = now + self.interval * (SAFETY_INTERVALS if self.events else 1)
            return True
        return False

    def close(self) -> None:
        if self.events:
            with contextlib.suppress(Exception):
                self.client.unsubscribe_topic(JOINED_TOPIC)
        if self._lease is not None:
            self._lease.release()
