"""The scheduler's short history of each collection, one point per report, for the page's charts."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: Counters whose increase the timeline marks, and the mark's name.
MARKED = {"restarts": "restart", "env_restarts": "env restart", "rollouts_lost": "lost rollout"}
#: Figures of the collection copied into each point as they are.
_COPIED = ("frames", "policy_lag", "policy_lag_max", "episode_return_mean", "episode_length_mean", *MARKED)


@dataclass
class History:
    """A bounded ring of points, ``seconds`` long, built from a collection's stats snapshots.

    Each point holds the snapshot's time (``t``, the driver's clock), the
    frames/s since the previous snapshot (total, and per collector index), and
    the figures in :data:`_COPIED`.
    """

    seconds: float
    points: deque = field(default_factory=deque)
    _frames: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (collector_id, frames)

    def add(self, snapshot: dict[str, Any]) -> None:
        """Appends the point of ``snapshot`` (ignored without a time) and drops points past the span."""
        t = snapshot.get("time")
        if not isinstance(t, (int, float)):
            return
        last = self.points[-1] if self.points else None
        if last is not None and t <= last["t"]:
            return  # a repeated or out-of-order report
        dt = t - last["t"] if last is not None else None
        point = {"t": t, **{k: snapshot.get(k) for k in _COPIED}}
        point["fps"] = (point["frames"] - last["frames"]) / dt if dt and point["frames"] is not None else None
        point["collectors"] = self._collector_rates(snapshot.get("collectors") or [], dt)
        self.points.append(point)
        while self.points and self.points[0]["t"] < t - self.seconds:
            self.points.popleft()

    def _collector_rates(self, rows: list[dict], dt: float | None) -> dict[int, float]:
        """Frames/s of each collector since the last point (from 0 for a new incarnation)."""
        rates: dict[int, float] = {}
        for row in rows:
            index, uid, frames = row.get("index"), row.get("collector_id"), row.get("frames") or 0
            before = self._frames.get(index)
            if dt and before is not None:
                rates[index] = (frames - (before[1] if before[0] == uid else 0)) / dt
            self._frames[index] = (uid, frames)
        present = {row.get("index") for row in rows}
        for gone in [index for index in self._frames if index not in present]:
            del self._frames[gone]  # a collector that left: its counts go with it
        return rates

    def series(self, key: str) -> list[tuple[float, float]]:
        """``(t, value)`` of each point with a number under ``key``."""
        return [(p["t"], p[key]) for p in self.points if isinstance(p.get(key), (int, float))]

    def collector_series(self) -> dict[int, list[tuple[float, float]]]:
        """Per collector index: ``(t, frames/s)``."""
        out: dict[int, list[tuple[float, float]]] = {}
        for p in self.points:
            for index, rate in p["collectors"].items():
                out.setdefault(index, []).append((p["t"], rate))
        return dict(sorted(out.items()))

    def marks(self) -> list[tuple[float, str]]:
        """``(t, what)`` for each point where a counter of :data:`MARKED` went up."""
        out = []
        for before, after in zip(self.points, list(self.points)[1:]):
            for key, what in MARKED.items():
                if (after.get(key) or 0) > (before.get(key) or 0):
                    out.append((after["t"], what))
        return out

    def as_list(self) -> list[dict]:
        """The points, for ``/daskcollect/json``."""
        return [{**p, "collectors": {str(k): v for k, v in p["collectors"].items()}} for p in self.points]
