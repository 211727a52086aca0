"""Small SVG charts drawn on the scheduler: no JavaScript, nothing fetched from elsewhere.

The ``/daskcollect`` page must work on a scheduler without internet access, and
Dask's Bokeh applications are fixed when the dashboard starts. So the charts are
plain inline SVG, rendered here from the scheduler's history
(:mod:`daskcollect.monitoring.history`). Every drawn series is a ``<path>`` with
``class="series"`` and ``data-points`` (its number of points), so a browser
test can count what was drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

#: Bokeh's Category10, the palette of Dask's own dashboard.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
MARK_COLOURS = {"restart": "#d62728", "env restart": "#ff7f0e", "lost rollout": "#9467bd"}
WIDTH, HEIGHT = 500, 165
LEFT, RIGHT, TOP, BOTTOM = 52, 120, 22, 24


@dataclass(frozen=True)
class Series:
    """One line: its legend label, ``(t, y)`` points and colour."""

    label: str
    points: Sequence[tuple[float, float]]
    colour: str
    width: float = 1.5


def nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least ``value`` (1 for 0)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.2g}"


def line_chart(
    title: str, series: Sequence[Series], now: float, span: float, marks: Sequence[tuple[float, str]] = ()
) -> Markup:
    """A time-series chart of the last ``span`` seconds up to ``now``, with vertical ``marks``.

    Args:
        title: Shown above the plot.
        series: The lines; those without points are left out of the plot and the legend.
        now: The right edge (the latest point's time).
        span: Seconds shown.
        marks: ``(t, what)``: a vertical line at ``t``, coloured by ``what``.
    """
    drawn = [s for s in series if s.points]
    top = nice_max(max((y for s in drawn for _, y in s.points), default=0.0))
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + pw * (1 - (now - t) / span) if span > 0 else LEFT + pw

    def y(v: float) -> float:
        return TOP + ph * (1 - max(v, 0.0) / top)

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<text x="{LEFT}" y="14" class="title">{escape(title)}</text>',
    ]
    for i in range(5):  # y grid and labels
        value = top * i / 4
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + pw}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{LEFT - 4}" y="{y(value) + 3:.1f}" text-anchor="end">{_number(value)}</text>'
        )
    for k in range(int(span // 60) + 1):  # x labels, one a minute
        t = now - 60 * k
        label = "now" if k == 0 else f"-{k}m"
        parts.append(
            f'<text class="tick" x="{x(t):.1f}" y="{HEIGHT - 8}" text-anchor="middle">{label}</text>'
        )
    for t, what in marks:
        if now - t <= span:
            colour = MARK_COLOURS.get(what, "#444")
            parts.append(
                f'<line class="mark" data-mark="{escape(what)}" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" '
                f'y2="{TOP + ph}" stroke="{colour}"><title>{escape(what)}</title></line>'
            )
    for row, s in enumerate(drawn):
        d = " ".join(f"{'M' if i == 0 else 'L'}{x(t):.1f},{y(v):.1f}" for i, (t, v) in enumerate(s.points))
        parts.append(
            f'<path class="series" data-series="{escape(s.label)}" data-points="{len(s.points)}" d="{d}" '
            f'fill="none" stroke="{s.colour}" stroke-width="{s.width}"/>'
        )
        if len(s.points) == 1:  # a path of one point draws nothing
            t, v = s.points[0]
            parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{s.colour}"/>')
        ly = TOP + 12 * row + 4
        if ly < HEIGHT - BOTTOM:
            parts.append(
                f'<line x1="{WIDTH - RIGHT + 8}" x2="{WIDTH - RIGHT + 22}" y1="{ly}" y2="{ly}" stroke="{s.colour}" stroke-width="2"/>'
            )
            parts.append(
                f'<text class="legend" x="{WIDTH - RIGHT + 26}" y="{ly + 3}">{escape(s.label)}</text>'
            )
    if not drawn:
        parts.append(
            f'<text class="empty" x="{LEFT + pw / 2}" y="{TOP + ph / 2}" text-anchor="middle">no data yet</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def stacked_bars(
    title: str, rows: Sequence[tuple[str, dict[str, float]]], parts_order: Sequence[str]
) -> Markup:
    """Horizontal stacked bars, one per row: each row's parts (seconds) drawn in ``parts_order``, in ms."""
    bar, gap = 14, 6
    height = max(TOP + len(rows) * (bar + gap) + 30, TOP + 12 * len(parts_order) + 10)
    total = nice_max(max((sum(split.values()) for _, split in rows), default=0.0))
    pw = WIDTH - LEFT - RIGHT
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{LEFT}" y="14" class="title">{escape(title)}</text>',
    ]
    for r, (label, split) in enumerate(rows):
        top, left = TOP + r * (bar + gap), float(LEFT)
        out.append(
            f'<text class="tick" x="{LEFT - 4}" y="{top + bar - 3}" text-anchor="end">{escape(label)}</text>'
        )
        for i, part in enumerate(parts_order):
            w = pw * split.get(part, 0.0) / total
            if w <= 0:
                continue
            ms = 1000 * split[part]
            out.append(
                f'<rect class="bar" data-part="{part}" x="{left:.1f}" y="{top}" width="{w:.1f}" height="{bar}" '
                f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(label)} {part}: {ms:.1f} ms</title></rect>'
            )
            left += w
    axis_y = TOP + len(rows) * (bar + gap) + 10
    out.append(f'<text class="tick" x="{LEFT}" y="{axis_y}">0</text>')
    out.append(
        f'<text class="tick" x="{LEFT + pw}" y="{axis_y}" text-anchor="end">{_number(1000 * total)} ms</text>'
    )
    for i, part in enumerate(parts_order):
        ly = TOP + 12 * i + 4
        colour = PALETTE[i % len(PALETTE)]
        out.append(f'<rect x="{WIDTH - RIGHT + 8}" y="{ly - 5}" width="10" height="8" fill="{colour}"/>')
        out.append(f'<text class="legend" x="{WIDTH - RIGHT + 22}" y="{ly + 3}">{part}</text>')
    out.append("</svg>")
    return Markup("".join(out))
