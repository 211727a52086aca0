"""Collectors on the Dask dashboard: a page at ``/daskcollect`` and Prometheus metrics at ``/metrics``.

Actor calls never pass through the scheduler, so Dask's own pages cannot show
them. Each ``DaskCollector`` sends a snapshot of its :meth:`stats` to the
scheduler as a Dask event (topic :data:`STATS_TOPIC`, at most once per
``daskcollect.dashboard.report-interval``), and the scheduler plugin
:class:`CollectorMonitor` keeps the latest snapshot of each collection. It
serves them on the dashboard's own HTTP server (same host and port):

- ``/daskcollect``: an HTML page (refreshing itself, rendered from the Jinja
  template ``templates/daskcollect.html.j2``) with, per collection, a table of
  totals, one row per collector, and SVG charts of the last few minutes
  (frames/s, policy lag, episode return and length, restarts and lost
  rollouts as marks, and each collector's time split), drawn from a bounded
  :class:`~daskcollect.monitoring.history.History` per collection;
- ``/daskcollect/json``: the same snapshots, each with its ``history``, as JSON;
- ``/metrics``: ``daskcollect_*`` series beside Dask's own Prometheus metrics
  (with ``prometheus_client`` installed, as for Dask's).
"""

from __future__ import annotations

import functools
import json
import time
import weakref
from typing import Any

import jinja2
from tornado import web

from daskcollect import _internals
from daskcollect.leases.scheduler import SharedPlugin
from daskcollect.monitoring import charts
from daskcollect.monitoring.history import History
from daskcollect.monitoring.stats import TIME_PARTS

STATS_TOPIC = "daskcollect-stats"
MONITOR_PLUGIN = "daskcollect-monitor"
PATH = "/daskcollect"


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("daskcollect.monitoring", "templates"), autoescape=True
    )
    return env.get_template("daskcollect.html.j2")


def _totals(c: dict) -> list[tuple[str, Any]]:
    return [
        ("mode", c.get("mode")), ("frames", c.get("frames")), ("total frames", c.get("total_frames")),
        ("frames/s", _rate(c.get("fps"))), ("live collectors", c.get("live_collectors")),
        ("restarts", c.get("restarts")), ("frames lost", c.get("frames_lost")),
        ("retired", c.get("retired")), ("policy version", c.get("policy_version")),
        ("policy lag", _mean(c.get("policy_lag"))), ("episodes", c.get("episodes")),
        ("return (mean)", _mean(c.get("episode_return_mean"))),
        ("length (mean)", _mean(c.get("episode_length_mean"))),
        ("collectors wanted", c.get("wanted_collectors")),
        ("worker-s / 1k frames", _by_class(c.get("worker_seconds_per_kframe"))),
        ("jobs not started", _by_class(c.get("jobs_waiting"), _show) if c.get("jobs_waiting") else None),
    ]  # fmt: skip


def _mean(value: Any) -> str | None:
    return f"{value:,.2f}" if isinstance(value, (int, float)) else None


# A snapshot may lack fields (sent by another daskcollect version): show those empty.
def _show(value: Any) -> str:
    return "" if value is None or isinstance(value, jinja2.Undefined) else str(value)


def _by_class(value: Any, show: Any = None) -> str | None:
    """``{"collector=1": 12.5}`` as ``collector=1: 12.50`` (``show`` formats the values)."""
    if not isinstance(value, dict):
        return None
    show = show or _mean
    return ", ".join(f"{k}: {show(v) or '-'}" for k, v in value.items())


def _rate(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else ""


class CollectorMonitor(SharedPlugin):
    """Keeps each collection's latest stats and serves them (page, JSON, Prometheus).

    Leased by each collection, and by :func:`keep_monitor`; the last lease out
    removes it, its pages and its metrics.
    """

    name = MONITOR_PLUGIN

    def __init__(self, history: float = 300.0) -> None:
        super().__init__()
        self._remove_routes: Any = None
        self.collections: dict[str, dict[str, Any]] = {}
        self.history_seconds = history
        self.histories: dict[str, History] = {}

    async def start(self, scheduler: Any) -> None:
        # None without a dashboard server (dashboard disabled): nothing to serve
        self._remove_routes = _internals.add_http_routes(
            scheduler,
            [
                (PATH + r"/?", _PageHandler, {"monitor": self}),
                (PATH + r"/json", _JsonHandler, {"monitor": self}),
            ],
        )
        metrics = _PrometheusCollector.installed()
        if metrics is not None:
            metrics.monitors.add(self)

    async def close(self) -> None:
        if self._remove_routes is not None:  # the pages go with the plugin
            self._remove_routes()
            self._remove_routes = None
        metrics = _PrometheusCollector.installed()
        if metrics is not None:
            metrics.monitors.discard(self)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == STATS_TOPIC and isinstance(msg, dict) and "id" in msg:
            self.collections[msg["id"]] = {**msg, "received": time.time()}
            self.histories.setdefault(msg["id"], History(self.history_seconds)).add(msg)
            # Closed collections stay visible, but only the last 20 of them.
            closed = [k for k, v in self.collections.items() if v.get("state") == "closed"]
            for key in closed[:-20]:
                del self.collections[key]
                self.histories.pop(key, None)

    def render(self) -> str:
        """The ``/daskcollect`` page."""
        ordered = sorted(self.collections.items(), key=lambda kv: -kv[1]["received"])
        figures = {cid: self.charts(cid) for cid, _ in ordered}
        return _template().render(
            collections=ordered, totals=_totals, show=_show, rate=_rate, mean=_mean, charts=figures
        )

    def charts(self, cid: str) -> list[Any]:
        """The SVG charts of collection ``cid`` (none before its second report)."""
        history, latest = self.histories.get(cid), self.collections.get(cid, {})
        if history is None or len(history.points) < 2:
            return []
        now = history.points[-1]["t"]
        # The axis grows with the collection, from a minute up to the whole history.
        span = min(max(now - history.points[0]["t"], 60.0), self.history_seconds)
        marks = history.marks()
        palette = charts.PALETTE
        per = history.collector_series()
        lines = [charts.Series("total", history.series("fps"), "#222", 2.0)]
        if len(per) <= 16:
            lines += [
                charts.Series(f"collector {i}", pts, palette[n % len(palette)])
                for n, (i, pts) in enumerate(per.items())
            ]
        splits = [
            (f"collector {row['index']}", row["time_split"])
            for row in latest.get("collectors") or []
            if row.get("time_split")
        ]
        out = [
            charts.line_chart("frames/s", lines, now, span, marks),
            charts.line_chart(
                "policy lag (weight versions behind the driver)",
                [
                    charts.Series("mean", history.series("policy_lag"), palette[0], 2.0),
                    charts.Series("max", history.series("policy_lag_max"), palette[3]),
                ],
                now, span, marks,
            ),
            charts.line_chart(
                "episode return (rolling mean)",
                [charts.Series("return", history.series("episode_return_mean"), palette[2], 2.0)],
                now, span, marks,
            ),
            charts.line_chart(
                "episode length (rolling mean, steps)",
                [charts.Series("length", history.series("episode_length_mean"), palette[4], 2.0)],
                now, span, marks,
            ),
        ]  # fmt: skip
        if splits:
            out.append(
                charts.stacked_bars("time per rollout, by part (last 20 rollouts)", splits, TIME_PARTS)
            )
        return out


class _PageHandler(web.RequestHandler):
    def initialize(self, monitor: CollectorMonitor) -> None:
        self.monitor = monitor

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(self.monitor.render())


class _JsonHandler(web.RequestHandler):
    def initialize(self, monitor: CollectorMonitor) -> None:
        self.monitor = monitor

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        monitor = self.monitor
        self.write(
            json.dumps(
                {
                    cid: {
                        **c,
                        "history": monitor.histories[cid].as_list() if cid in monitor.histories else [],
                    }
                    for cid, c in monitor.collections.items()
                }
            )
        )


class _PrometheusCollector:
    """``daskcollect_*`` series for Dask's ``/metrics`` endpoint.

    One per process (Prometheus' registry refuses duplicate series), serving
    every scheduler's monitor in it; the ``collection`` label keeps them apart.
    """

    _instance: _PrometheusCollector | None = None

    def __init__(self) -> None:
        self.monitors: weakref.WeakSet[CollectorMonitor] = weakref.WeakSet()

    @classmethod
    def installed(cls) -> _PrometheusCollector | None:
        """The process' collector, registered on first use; ``None`` without prometheus_client."""
        if cls._instance is None:
            try:
                import prometheus_client
            except ImportError:
                return None
            cls._instance = cls()
            prometheus_client.REGISTRY.register(cls._instance)
        return cls._instance

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        label = ["collection"]
        frames = CounterMetricFamily("daskcollect_frames", "Frames delivered to the driver", labels=label)
        lost = CounterMetricFamily(
            "daskcollect_frames_lost", "Frames of rollouts dropped whole", labels=label
        )
        restarts = CounterMetricFamily(
            "daskcollect_restarts", "Collectors replaced after a loss", labels=label
        )
        fps = GaugeMetricFamily(
            "daskcollect_frames_per_second", "Frames/s since the first batch", labels=label
        )
        live = GaugeMetricFamily("daskcollect_live_collectors", "Collectors running", labels=label)
        returns = GaugeMetricFamily(
            "daskcollect_episode_return_mean", "Mean return of the recent episodes", labels=label
        )
        lag = GaugeMetricFamily(
            "daskcollect_policy_lag", "Mean weight versions recent rollouts were behind", labels=label
        )
        per = ["collection", "collector", "worker"]
        c_frames = CounterMetricFamily("daskcollect_collector_frames", "Frames of one collector", labels=per)
        c_fps = GaugeMetricFamily("daskcollect_collector_frames_per_second", "Rollout frames/s", labels=per)
        c_version = GaugeMetricFamily("daskcollect_collector_policy_version", "Weights version", labels=per)
        collections = [kv for m in list(self.monitors) for kv in m.collections.items()]
        for cid, c in collections:
            if c.get("state") == "closed":
                continue
            frames.add_metric([cid], c.get("frames", 0))
            lost.add_metric([cid], c.get("frames_lost", 0))
            restarts.add_metric([cid], c.get("restarts", 0))
            fps.add_metric([cid], c.get("fps") or 0.0)
            live.add_metric([cid], c.get("live_collectors", 0))
            if c.get("episode_return_mean") is not None:
                returns.add_metric([cid], c["episode_return_mean"])
            if c.get("policy_lag") is not None:
                lag.add_metric([cid], c["policy_lag"])
            for row in c.get("collectors", []):
                labels = [cid, str(row["index"]), str(row["worker"])]
                c_frames.add_metric(labels, row.get("frames", 0))
                c_fps.add_metric(labels, row.get("fps") or 0.0)
                c_version.add_metric(labels, row.get("policy_version") or 0)
        yield from (frames, lost, restarts, fps, live, returns, lag, c_frames, c_fps, c_version)
