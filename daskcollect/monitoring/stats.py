"""Typed counters: failures, one collector, one collection."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from daskcollect.errors import CollectorLostError

#: The parts of a rollout's time, in the order the page stacks them. They live
#: here, not with the probes that measure them, so that the scheduler's page
#: plugin can name them without importing torch.
TIME_PARTS = ("env", "policy", "weights", "output", "other")


@dataclass
class FailureCounters:
    """What was lost, how often collectors were replaced, and the restart budget.

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
    last_failure: str | None = field(default=None, compare=False)

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
        """The counters (without ``last_failure``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "last_failure"}


@dataclass(frozen=True)
class CollectorStats:
    """One collector, as :meth:`~daskcollect.DaskCollector.stats` lists it.

    Attributes:
        index: The collector's index.
        worker: The address of its worker.
        collector_id: Its actor incarnation (``("collector", "collector_id")`` in its frames).
        state: ``"collecting"`` (a rollout running), ``"idle"`` or ``"retiring"``.
        rollouts: Rollouts it delivered.
        frames: Frames it delivered.
        fps: Its frames per second of rollout time.
        policy_version: The weights version of its last rollout.
        weights_route: How it got its latest weights: ``"shared-memory"``,
            ``"dask"``, or ``None`` (only those it was built with).
        episodes: Episodes that ended in its rollouts.
        episode_return_mean: Mean return of its last ``episode-window``
            episodes (``None`` before the first).
        episode_length_mean: Their mean length in steps.
        policy_lag: Weight versions its last rollout was behind the driver's
            when it arrived.
        time_split: Mean seconds per rollout, over its last 20, spent on
            ``env`` steps, ``policy`` calls, loading ``weights``, ``output``
            (labelling, memmap or replay-buffer writes) and ``other``.
    """

    index: int
    worker: str
    collector_id: int
    state: str
    rollouts: int
    frames: int
    fps: float
    policy_version: int
    weights_route: str | None
    episodes: int = 0
    episode_return_mean: float | None = None
    episode_length_mean: float | None = None
    policy_lag: int | None = None
    time_split: dict[str, float] | None = None


@dataclass(frozen=True)
class CollectionStats:
    """A whole collection's counters, beside TorchRL's own (``frames``, ``batches``...).

    Attributes:
        failures: Losses, restarts and retirements.
        live_collectors: Collectors running now.
        collectors: One entry per live collector, in index order.
        telemetry: ``episodes``, ``episode_return_mean`` and
            ``episode_length_mean`` (last ``episode-window`` episodes of all
            collectors), ``policy_lag`` (mean over as many recent rollouts of
            the versions they were behind the driver's), ``policy_lag_max`` and
            ``time_split`` (the collectors' mean).
    """

    failures: FailureCounters
    live_collectors: int
    collectors: tuple[CollectorStats, ...] = ()
    telemetry: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The flat dict that ``stats()`` returns and the dashboard receives."""
        return {
            **self.failures.as_dict(),
            "live_collectors": self.live_collectors,
            **self.telemetry,
            "collectors": [asdict(c) for c in self.collectors],
        }
