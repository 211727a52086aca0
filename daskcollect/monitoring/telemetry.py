"""What the driver keeps of each rollout's record: episodes, policy lag and the time split.

Everything here comes from the rollouts' small records (see
:mod:`daskcollect.monitoring.worker`), never from the batches: it works the same
with memmap output and with the cluster's replay buffer.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from daskcollect.monitoring.stats import TIME_PARTS
from daskcollect.worker.rollout import Rollout

#: Rollouts of one collector that its time split averages over.
SPLIT_WINDOW = 20


def _mean(values: deque) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class EpisodeWindow:
    """The count of episodes, and the returns and lengths of the last ``window`` of them."""

    window: int
    count: int = 0
    returns: deque = field(init=False)
    lengths: deque = field(init=False)

    def __post_init__(self) -> None:
        self.returns, self.lengths = deque(maxlen=self.window), deque(maxlen=self.window)

    def extend(self, returns: tuple[float, ...], lengths: tuple[int, ...]) -> None:
        self.count += len(returns)
        self.returns.extend(returns)
        self.lengths.extend(lengths)

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "episodes": self.count,
            "episode_return_mean": _mean(self.returns),
            "episode_length_mean": _mean(self.lengths),
        }


@dataclass
class _CollectorTelemetry:
    episodes: EpisodeWindow
    splits: deque = field(default_factory=lambda: deque(maxlen=SPLIT_WINDOW))
    policy_lag: int | None = None

    def time_split(self) -> dict[str, float] | None:
        if not self.splits:
            return None
        return {part: sum(s[part] for s in self.splits) / len(self.splits) for part in TIME_PARTS}


class Telemetry:
    """Rolling episode statistics, policy lag and time split, overall and per collector index.

    ``stats()`` may be called from any thread while the iteration (or a
    background collection) records rollouts, so both sides take one lock.

    Args:
        episode_window: Episodes the return and length means cover.
    """

    def __init__(self, episode_window: int):
        self._lock = threading.Lock()
        self.window = episode_window
        self.episodes = EpisodeWindow(episode_window)
        self.lags: deque[int] = deque(maxlen=episode_window)
        self._collectors: dict[int, _CollectorTelemetry] = {}

    def record(self, rollout: Rollout, lag: int) -> None:
        """Takes in one delivered rollout, ``lag`` weight versions behind the driver's."""
        with self._lock:
            self._record(rollout, lag)

    def _record(self, rollout: Rollout, lag: int) -> None:
        own = self._collectors.get(rollout.index)
        if own is None:
            own = self._collectors[rollout.index] = _CollectorTelemetry(EpisodeWindow(self.window))
        if rollout.episode_returns is not None:
            self.episodes.extend(rollout.episode_returns, rollout.episode_lengths)
            own.episodes.extend(rollout.episode_returns, rollout.episode_lengths)
        if rollout.time_split is not None:
            own.splits.append(rollout.time_split)
        own.policy_lag = lag
        self.lags.append(lag)

    def forget(self, index: int) -> None:
        """Drops collector ``index``'s figures (it left for good; the collection's stay)."""
        with self._lock:
            self._collectors.pop(index, None)

    def indices(self) -> set[int]:
        """The collectors whose figures are kept."""
        with self._lock:
            return set(self._collectors)

    def size(self) -> int:
        """How many collectors' figures are kept."""
        return len(self._collectors)

    def collector(self, index: int) -> dict:
        """One collector's figures (empty figures before its first rollout)."""
        with self._lock:
            return self._collector(index)

    def _collector(self, index: int) -> dict:
        own = self._collectors.get(index) or _CollectorTelemetry(EpisodeWindow(self.window))
        return {**own.episodes.as_dict(), "policy_lag": own.policy_lag, "time_split": own.time_split()}

    def collection(self, indices: list[int]) -> dict:
        """The collection's figures; the time split is the mean over the collectors ``indices``."""
        with self._lock:
            splits = [s for i in indices if (s := self._collector(i)["time_split"]) is not None]
            split = {p: sum(s[p] for s in splits) / len(splits) for p in TIME_PARTS} if splits else None
            return {
                **self.episodes.as_dict(),
                "policy_lag": _mean(self.lags),
                "policy_lag_max": max(self.lags, default=None),
                "time_split": split,
            }
