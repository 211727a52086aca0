"""Failure accounting: what was lost, how often collectors were replaced, and the restart budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from daskcollect.errors import CollectorLostError


@dataclass
class FailureCounters:
    """Counters exposed by :meth:`~daskcollect.DaskCollector.stats`.

    Attributes:
        frames_lost: Frames asked of rollout calls that never returned (an upper
            bound in async mode: a queued call that had not started counts).
        rollouts_lost: Those calls.
        restarts: Collectors replaced after a lost worker or a stuck rollout.
        env_restarts: Collectors rebuilt after an env error (``on_env_error="restart"``).
        retired: Collectors closed because their worker retired gracefully
            (scale-down, ``adapt``, ``--lifetime``); they lose nothing.
        last_failure: What happened last, for error messages.
    """

    frames_lost: int = 0
    rollouts_lost: int = 0
    restarts: int = 0
    env_restarts: int = 0
    retired: int = 0
    last_failure: str | None = None

    def lost(self, rollouts: int, frames_each: int, cause: str) -> None:
        """Counts rollouts dropped whole."""
        self.rollouts_lost += rollouts
        self.frames_lost += rollouts * frames_each
        self.last_failure = cause

    def check_budget(self, limit: int) -> None:
        """Raises :class:`CollectorLostError` once restarts exceed ``limit``."""
        used = self.restarts + self.env_restarts
        if used > limit:
            raise CollectorLostError(
                f"Collectors were restarted {used} times, more than max_collector_restarts={limit} "
                f"({self.restarts} lost workers or stuck rollouts, {self.env_restarts} env errors). "
                f"Last failure: {self.last_failure}. Fix the cause, or raise max_collector_restarts.",
                restarts=self.restarts,
                env_restarts=self.env_restarts,
            )

    def as_dict(self) -> dict[str, int]:
        out = asdict(self)
        del out["last_failure"]
        return out
