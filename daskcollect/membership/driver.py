"""The workers that join and leave, from the scheduler's own events: :class:`ClusterEvents` (runs on the driver).

A collection must learn that a collector's worker left (its rollouts will not
come), that a worker joined (a collection that follows the cluster gives it a
collector), and that an inference server's worker is gone (it is started
again elsewhere). Asking the scheduler for its workers on a timer costs it an
answer the size of the cluster each time. Instead, the scheduler's own events
say it: Dask logs every worker it adds or removes on its ``"all"`` topic, and
one subscription per collection's ``Client`` hands them to the listeners here,
on the client's event loop. Nothing is installed on the scheduler, so this
works wherever a ``Client`` does.

A subscription takes effect when the scheduler has read it; the events logged
before that are not sent. :class:`ClusterEvents` therefore waits for an echo
of its own on the same ordered stream (:func:`~daskcollect.deploy.handle.echo`)
before it reads the workers once: from then on every change arrives as an event.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from daskcollect import _internals
from daskcollect.deploy.handle import echo

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ``listener(address)``, called on the client's event loop.
Listener = Callable[[str], None]


class ClusterEvents:
    """One collection's view of the scheduler's worker joins and removals.

    Args:
        client: The collection's ``Client`` (one subscription per client: the
            collection's components add listeners here instead).
        timeout: Bound on the echo that makes the subscription certain.
    """

    def __init__(self, client: Any, timeout: float):
        self.client = client
        self._on_join: list[Listener] = []
        self._on_leave: list[Listener] = []
        self._changed = threading.Condition()
        self._generation = 0  # bumped by every join or leave
        self._joined = True  # "look at the workers": once at the start, then after each join
        self._closed = False
        self.joins = self.leaves = 0
        client.subscribe_topic(_internals.WORKER_EVENTS_TOPIC, self._on_event)
        if not echo(client, timeout):
            logger.warning("the scheduler did not echo within %gs: worker events may start late", timeout)

    # --- listeners ----------------------------------------------------------
    def on_join(self, listener: Listener) -> Callable[[], None]:
        """Calls ``listener(address)`` on the event loop for every worker that joins; returns its remover."""
        self._on_join.append(listener)
        return lambda: self._discard(self._on_join, listener)

    def on_leave(self, listener: Listener) -> Callable[[], None]:
        """Calls ``listener(address)`` on the event loop for every worker removed; returns its remover."""
        self._on_leave.append(listener)
        return lambda: self._discard(self._on_leave, listener)

    @staticmethod
    def _discard(listeners: list[Listener], listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            listeners.remove(listener)

    def _on_event(self, event: tuple[float, Any]) -> None:
        change = _internals.worker_change(event[1])
        if change is None:
            return
        kind, address = change
        if kind == "added":
            self.joins += 1
            self._joined = True
        else:
            self.leaves += 1
        for listener in list(self._on_join if kind == "added" else self._on_leave):
            try:
                listener(address)
            except Exception:  # one listener's failure must not keep the others from hearing it
                logger.exception("a listener of worker %s failed", kind)
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    # --- waiting ------------------------------------------------------------
    def maybe_joined(self) -> bool:
        """Whether a worker joined since the last call (``True`` the first time); resets the flag."""
        joined, self._joined = self._joined, False
        return joined

    def wait_until(
        self, check: Callable[[], T], timeout: float, *, fail: Callable[[], BaseException] | None = None
    ) -> T:
        """Calls ``check()`` now and after every join or removal until it is truthy, at most ``timeout`` s.

        Returns:
            The first truthy value of ``check()``, or its last value.

        Raises:
            What ``fail()`` builds, if given and time runs out.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                seen = self._generation
            value = check()
            left = deadline - time.monotonic()
            if value or left <= 0 or self._closed:
                break
            with self._changed:
                self._changed.wait_for(lambda seen=seen: self._generation != seen or self._closed, left)
        if not value and fail is not None:
            raise fail()
        return value

    def close(self) -> None:
        """Unsubscribes (idempotent) and wakes every waiter."""
        if self._closed:
            return
        self._closed = True
        self._on_join.clear()
        self._on_leave.clear()
        with self._changed:
            self._changed.notify_all()
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(_internals.WORKER_EVENTS_TOPIC)
