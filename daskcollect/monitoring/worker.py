"""What each rollout measures on its worker: the episodes that ended in it, and where its time went.

Both travel in the rollout's small record, so the driver, its dashboard page
and its logger get them without reading the batch (memmap output and the
cluster's replay buffer never bring it to the driver).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from daskcollect import _internals
from daskcollect.monitoring.stats import TIME_PARTS


class EpisodeTracker:
    """Returns and lengths of the episodes that end in each batch, across batches.

    An episode that spans batches is carried per env (each row of the batch
    but its last, time, dimension). The carry is dropped when the env's next
    batch starts another trajectory (``("collector", "traj_ids")`` differs:
    ``reset_at_each_iter``, or a rebuilt collector).
    """

    def __init__(self) -> None:
        self._returns: torch.Tensor | None = None  # per env: return so far of the open episode
        self._lengths: torch.Tensor | None = None
        self._traj: torch.Tensor | None = None  # per env: the open episode's trajectory id

    def reset(self) -> None:
        """Forgets open episodes (the envs were rebuilt)."""
        self._returns = self._lengths = self._traj = None

    def update(self, batch: TensorDictBase) -> tuple[tuple[float, ...], tuple[int, ...]] | None:
        """The returns and lengths of the episodes that ended in ``batch``.

        Returns:
            ``None`` when the batch has no ``("next", "reward")`` or
            ``("next", "done")`` (multi-agent keys, for one).
        """
        reward, done = batch.get(("next", "reward"), None), batch.get(("next", "done"), None)
        if reward is None or done is None or batch.ndim == 0:
            return None
        steps = batch.shape[-1]
        rows = batch.shape[:-1].numel()
        reward = reward.detach().reshape(rows, steps, -1).sum(-1).to(torch.float64)
        done = done.reshape(rows, steps, -1).any(-1)
        traj = batch.get(("collector", "traj_ids"), None)
        traj = traj.reshape(rows, steps) if traj is not None and traj.numel() == rows * steps else None
        carry_r, carry_l = self._carry(rows, traj)
        cum = reward.cumsum(1)
        returns: list[float] = []
        lengths: list[int] = []
        ends = done.nonzero().tolist()  # row-major: each row's ends in time order
        last_end: dict[int, int] = {}
        for row, t in ends:
            prev = last_end.get(row)
            if prev is None:
                returns.append(float(cum[row, t] + carry_r[row]))
                lengths.append(int(t + 1 + carry_l[row]))
            else:
                returns.append(float(cum[row, t] - cum[row, prev]))
                lengths.append(t - prev)
            last_end[row] = t
        self._keep_open(cum, carry_r, carry_l, last_end, steps, traj)
        return tuple(returns), tuple(lengths)

    def _carry(self, rows: int, traj: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        carry_r = torch.zeros(rows, dtype=torch.float64)
        carry_l = torch.zeros(rows, dtype=torch.int64)
        if self._returns is None or self._returns.shape[0] != rows:
            return carry_r, carry_l
        keep = torch.ones(rows, dtype=torch.bool)
        if traj is not None and self._traj is not None:
            keep = traj[:, 0] == self._traj
        return torch.where(keep, self._returns, carry_r), torch.where(keep, self._lengths, carry_l)

    def _keep_open(
        self,
        cum: torch.Tensor,
        carry_r: torch.Tensor,
        carry_l: torch.Tensor,
        last_end: dict[int, int],
        steps: int,
        traj: torch.Tensor | None,
    ) -> None:
        """Carries each env's unfinished episode into its next batch."""
        open_r, open_l = cum[:, -1] + carry_r, carry_l + steps
        for row, t in last_end.items():
            open_r[row] = cum[row, -1] - cum[row, t]
            open_l[row] = steps - 1 - t
        self._returns, self._lengths = open_r, open_l
        self._traj = traj[:, -1].clone() if traj is not None else None


class _Timed:
    """Calls ``fn`` and adds its wall time to ``clock[part]``."""

    def __init__(self, fn: Callable, clock: dict[str, float], part: str):
        self.fn, self.clock, self.part = fn, clock, part

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.clock[self.part] += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:  # the collector reads the policy's attributes
        return getattr(self.fn, name)


class TimeSplit:
    """Splits each rollout's wall time into :data:`TIME_PARTS`.

    On a single-process TorchRL ``Collector`` the env's
    ``step_and_maybe_reset`` and the policy's calls are timed in place. Other
    collector classes (``MultiSyncCollector``...) step their envs in their own
    processes: there the rollout's time shows as ``other``. The actor times
    ``weights`` (loading new weights) and ``output`` (labelling the batch and
    writing it to a memory map or the replay buffer; Dask serializes a returned
    batch after the call, outside the rollout).
    """

    def __init__(self) -> None:
        self.clock = dict.fromkeys(TIME_PARTS, 0.0)

    def instrument(self, collector: Any) -> bool:
        """Times ``collector``'s env steps and policy calls; ``False`` if it has neither to time."""
        env = getattr(collector, "env", None)
        compiled = getattr(collector, "compiled_policy", False) or getattr(
            collector, "cudagraphed_policy", False
        )
        if env is None or compiled:
            return False
        if not _internals.wrap_collector_policy(
            collector, lambda policy: _Timed(policy, self.clock, "policy")
        ):
            return False
        env.step_and_maybe_reset = _Timed(env.step_and_maybe_reset, self.clock, "env")
        return True

    def start(self) -> None:
        """Zeroes the clock before a rollout."""
        for part in TIME_PARTS:
            self.clock[part] = 0.0

    def add(self, part: str, seconds: float) -> None:
        self.clock[part] += seconds

    def finish(self, total: float) -> dict[str, float]:
        """The rollout's split; ``other`` is what the timed parts leave of ``total``."""
        timed = sum(self.clock[p] for p in TIME_PARTS if p != "other")
        return {**self.clock, "other": max(total - timed, 0.0)}
