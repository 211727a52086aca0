"""The driver's side of scaling to demand: :class:`Demand` and the lease on the scheduler plugin.

Runs on the driver.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from daskcollect.leases.driver import Lease
from daskcollect.scaling.scheduler import DemandScaling


class Demand:
    """The learner's consumption against a collector's production, and the collectors that match.

    The learner's rate is measured only while it holds a batch (from a batch's
    yield to the next request), so a learner starved by too few collectors
    still shows how fast it could go. Both rates are smoothed over the last
    ``window`` batches.

    Args:
        headroom: Collectors wanted per collector that exactly matches the
            learner (above 1, the learner does not wait on the slowest rollout).
        window: Batches the exponential mean spans.
    """

    def __init__(self, headroom: float = 1.2, window: int = 8) -> None:
        self.headroom = headroom
        self._alpha = 2.0 / (window + 1)
        self.learner_fps: float | None = None

    def consumed(self, frames: int, seconds: float) -> None:
        """Records that the learner held a batch of ``frames`` for ``seconds``."""
        rate = frames / max(seconds, 1e-4)
        self.learner_fps = (
            rate if self.learner_fps is None else self.learner_fps + self._alpha * (rate - self.learner_fps)
        )

    def wanted(self, collectors: list[dict[str, Any]], fixed: int | None = None) -> int | None:
        """Collectors that keep the learner fed, given the live ones' stats.

        Args:
            collectors: ``stats()["collectors"]``.
            fixed: The collectors a collection with a set ``num_collectors`` keeps: it wants their
                workers, no more and no fewer.

        Returns:
            The count, or ``None`` before the first measure.
        """
        if fixed is not None:
            return fixed
        rates = [c["fps"] for c in collectors if c.get("fps")]
        if self.learner_fps is None or not rates:
            return None
        return max(1, math.ceil(self.headroom * self.learner_fps / (sum(rates) / len(rates))))

    def as_dict(self, collectors: list[dict[str, Any]], fixed: int | None = None) -> dict[str, Any]:
        """What the stats carry: ``learner_fps`` and ``wanted_collectors``."""
        return {"learner_fps": self.learner_fps, "wanted_collectors": self.wanted(collectors, fixed)}


def install_demand_scaling(client: Any, timeout: float) -> Lease | None:
    """Leases :class:`DemandScaling` on the client's scheduler (``None``, with a warning, if it cannot load)."""
    try:
        return Lease(client, DemandScaling(), timeout=timeout)
    except Exception as exc:
        warnings.warn(
            f"daskcollect could not install its scaling hook on the scheduler ({type(exc).__name__}: {exc}). "
            "Dask's Adaptive will not follow the learner's demand. Install daskcollect in the "
            "scheduler's environment to have it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
