"""Notebook display of a ``DaskCollector``, in the style of Dask's own ``Client`` and cluster reprs."""

from __future__ import annotations

import functools
from typing import Any

import jinja2


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("daskcollect.monitoring", "templates"), autoescape=True
    )
    return env.get_template("collector.html.j2")


def collectors_page(dashboard_link: str | None) -> str | None:
    """The ``/daskcollect`` page beside a dashboard link such as ``http://host:8787/status``."""
    if not dashboard_link:
        return None
    return dashboard_link.rsplit("/", 1)[0] + "/daskcollect"


def render(summary: dict[str, Any], stats: dict[str, Any]) -> str:
    """The HTML of one collector.

    Args:
        summary: ``mode``, ``state``, ``frames_per_batch``, ``dashboard`` (link
            or ``None``), ``client`` (the scheduler's address).
        stats: The collector's ``stats()``.
    """
    return _template().render(
        s=summary,
        stats=stats,
        page=collectors_page(summary.get("dashboard")),
        fmt=lambda v, spec=",": format(v, spec) if isinstance(v, (int, float)) else "",
    )


def describe(collector: Any) -> str:
    """``repr()`` of a ``DaskCollector``."""
    mode = "sync" if collector.spec.batch.sync else "async"
    state = "closed" if collector.closed else "open"
    return (
        f"{type(collector).__name__}(num_collectors={collector.num_collectors}, {mode}, "
        f"frames_per_batch={collector.frames_per_batch}, total_frames={collector.total_frames}, {state})"
    )


def render_collector(collector: Any) -> str:
    """Jupyter's view of a ``DaskCollector``: mode, collectors, frames so far, links to the dashboard."""
    client = collector.client
    summary = {
        "mode": "sync" if collector.spec.batch.sync else "async",
        "state": "closed" if collector.closed else "open",
        "frames_per_batch": collector.frames_per_batch,
        "dashboard": collector.dashboard_link,
        "scheduler": getattr(getattr(client, "scheduler", None), "address", None),
    }
    return render(summary, collector.stats())
