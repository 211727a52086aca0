"""The driver's side of leases: :class:`Lease`, one collection's hold on a shared scheduler plugin.

Runs on the driver.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

from daskcollect.leases.scheduler import SharedPlugin, acquire, release_lease, set_detail

logger = logging.getLogger(__name__)


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
