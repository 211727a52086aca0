"""The driver's side of monitoring: the lease on the dashboard's plugin, and the stats it sends, throttled.

Runs on the driver. It sends a collection's stats to the scheduler's dashboard page and a TorchRL logger.

Monitoring never breaks or slows a collection: the scheduler gets its snapshot
without waiting (except the forced ones at start and shutdown, bounded). A
logger is driven through TorchRL's own
:class:`~torchrl.record.loggers.monitoring.LoggerMonitor` (rates from counter
deltas, ``collector/<name>`` metrics, the frame count as the step); it runs no
thread of its own here, but one step per report, and a logger that raises is
warned about once per failure streak and otherwise ignored.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import dask
from dask.utils import parse_timedelta

from daskcollect import _internals
from daskcollect.errors import ConfigurationError
from daskcollect.leases.driver import Lease, lease
from daskcollect.monitoring.scheduler import STATS_TOPIC, CollectorMonitor

logger = logging.getLogger(__name__)


def check_logger(torchrl_logger: Any) -> Any:
    """Returns ``torchrl_logger`` if it can log metrics (``None`` passes).

    Raises:
        ConfigurationError: If it has no ``log_metrics(metrics, step)``, which
            TorchRL's ``LoggerMonitor`` calls.
    """
    if torchrl_logger is not None and not callable(getattr(torchrl_logger, "log_metrics", None)):
        raise ConfigurationError(
            f"logger must be a torchrl.record.loggers.Logger (it needs log_metrics(metrics, step)), "
            f"got {type(torchrl_logger).__name__}. Pass e.g. torchrl.record.CSVLogger('run', log_dir='logs')."
        )
    return torchrl_logger


def scalars(snapshot: dict[str, Any]) -> dict[str, float]:
    """The scalars of a stats snapshot that a logger gets: its numbers, and the time split in ms."""
    out = {k: v for k, v in snapshot.items() if isinstance(v, (int, float)) and k != "time"}
    for part, seconds in (snapshot.get("time_split") or {}).items():
        out[f"time_{part}_ms"] = 1000.0 * seconds
    return out


class Reporter:
    """Sends snapshots on the :data:`~daskcollect.monitoring.scheduler.STATS_TOPIC` event topic.

    Args:
        client: Our ``Client``.
        report_id: Names the collection on the page.
        interval: At most one snapshot per this many seconds (unless forced).
        timeout: Bound on a forced (synchronous) report.
        torchrl_logger: A TorchRL ``Logger`` that gets the :func:`scalars` of
            each snapshot as ``collector/<name>`` (plus TorchRL's
            ``collector/frames_per_second`` and ``batches_per_second``), the
            frame count as the step.
    """

    def __init__(
        self, client: Any, report_id: str, interval: float, timeout: float, torchrl_logger: Any = None
    ):
        self.client = client
        self.report_id = report_id
        self.interval = interval
        self.timeout = timeout
        self._next = 0.0
        self._last: dict[str, float] = {}
        self._monitor = None
        if torchrl_logger is not None:
            from torchrl.record.loggers.monitoring import LoggerMonitor

            self._monitor = LoggerMonitor(torchrl_logger, background=False, on_error="warn")
            self._monitor.watch(self, name="collector", stats_fn=lambda: self._last, step="frames")

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
                    k: v
                    for k, v in snapshot().items()
                    if isinstance(v, (int, float, str, list, dict)) or v is None
                },
                "id": self.report_id,
                "name": f"DaskCollector {self.report_id}",
                "state": state,
            }
        except Exception as exc:
            logger.debug("could not take a stats snapshot: %s", exc)
            return
        self._send(msg, force)
        if self._monitor is not None and state != "ready":
            self._last = scalars(msg)
            if state == "collecting":  # the closed one is logged by close()
                self._monitor.step()

    def close(self, snapshot: Callable[[], dict]) -> None:
        """Sends the final snapshot (marked ``closed``) and logs it; idempotent."""
        if self._next == float("inf"):
            return
        self.report(snapshot, "closed", force=True)
        self._next = float("inf")
        if self._monitor is not None:
            self._monitor.stop()  # logs the final snapshot

    def _send(self, msg: dict, force: bool) -> None:
        try:
            # At start and shutdown it is delivered before going on (bounded); else it is not waited for.
            _internals.log_event(self.client, STATS_TOPIC, msg, wait=self.timeout if force else None)
        except Exception as exc:
            logger.debug("could not report to the dashboard: %s", exc)


def install_monitor(client: Any, history: float, timeout: float = 30.0) -> Lease | None:
    """Leases :class:`CollectorMonitor` on the client's scheduler (installed by the first lease).

    Args:
        client: Our ``Client``.
        history: Seconds of history the charts keep (``daskcollect.dashboard.history``);
            the lease that installs it sets it.
        timeout: Bound on each call to the scheduler.

    Returns:
        The lease, to release when the collection closes; ``None`` where the
        scheduler cannot load the plugin: the collection then runs without a
        dashboard page.
    """
    return lease(client, CollectorMonitor(history), timeout)


@contextlib.contextmanager
def keep_monitor(client: Any, history: float | None = None) -> Iterator[bool]:
    """Keeps the ``/daskcollect`` page and the metrics on the scheduler between collections.

    The page goes with the last collection that uses it; inside this block it
    stays, with the closed collections' last figures, until the block ends.

    Args:
        client: A ``Client`` of the cluster.
        history: Seconds of history the charts keep (default ``daskcollect.dashboard.history``).

    Yields:
        Whether the scheduler serves the page (``False`` where it cannot load daskcollect).
    """
    if history is None:
        history = parse_timedelta(dask.config.get("daskcollect.dashboard.history"))
    held = install_monitor(client, history)
    try:
        yield held is not None
    finally:
        if held is not None:
            held.release()
