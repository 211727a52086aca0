"""Sends a collection's stats to the scheduler's dashboard page, throttled and never blocking."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from daskcollect.monitoring.dashboard import STATS_TOPIC

logger = logging.getLogger(__name__)


class Reporter:
    """Sends snapshots on the :data:`~daskcollect.monitoring.dashboard.STATS_TOPIC` event topic.

    Args:
        client: Our ``Client``.
        report_id: Names the collection on the page.
        interval: At most one snapshot per this many seconds (unless forced).
        timeout: Bound on a forced (synchronous) report.
    """

    def __init__(self, client: Any, report_id: str, interval: float, timeout: float):
        self.client = client
        self.report_id = report_id
        self.interval = interval
        self.timeout = timeout
        self._next = 0.0

    def report(self, snapshot: Callable[[], dict], state: str = "collecting", force: bool = False) -> None:
        """Sends ``snapshot()`` with ``state``; forced reports are delivered before returning.

        Monitoring never breaks a collection: a failure is logged at debug level.
        """
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.interval
        try:
            msg = {
                **{
                    k: v for k, v in snapshot().items() if isinstance(v, (int, float, str, list)) or v is None
                },
                "id": self.report_id,
                "name": f"DaskCollector {self.report_id}",
                "state": state,
            }
            log = functools.partial(self.client.scheduler.log_event, topic=STATS_TOPIC, msg=msg)
            if force:  # at start and shutdown: deliver it before going on (bounded)
                self.client.sync(log, callback_timeout=self.timeout)
            else:
                self.client.loop.add_callback(log)
        except Exception as exc:
            logger.debug("could not report to the dashboard: %s", exc)
