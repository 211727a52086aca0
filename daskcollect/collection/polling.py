"""One bounded wait: :func:`poll_until`, for every deadline loop in daskcollect."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(
    check: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.1,
    fail: Callable[[], BaseException] | None = None,
) -> T:
    """Calls ``check()`` until it returns a truthy value, at most ``timeout`` seconds.

    Args:
        check: Called at once, then every ``interval`` seconds.
        timeout: The bound, in seconds.
        interval: The pause between calls.
        fail: Builds the exception raised when the time is up; without it the
            last (falsy) value of ``check()`` is returned.

    Returns:
        The first truthy value of ``check()`` (or its last value, see ``fail``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            break
        time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)))
    if not value and fail is not None:
        raise fail()
    return value


async def apoll_until(check: Callable[[], T], timeout: float, *, interval: float = 0.05) -> T:
    """The event-loop form of :func:`poll_until` (no ``fail``: returns the last value)."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        await asyncio.sleep(interval)
    return value
