"""The output stage: one batch's rollouts, in collector order, into what the iterator yields (runs on the driver).

In the order TorchRL's collectors apply them:

- ``output="memmap"``: a :class:`~daskcollect.collection.memmap.MemmapBatch`
  handle over the rollouts' folders, tracked by the ledger; with a replay
  buffer, the buffer is extended from the memory maps and the handle released;
- sync mode stacks the collectors' rollouts ``[N, ...]`` (``MultiSyncCollector``
  with ``cat_results="stack"``), async mode yields one rollout as it is;
- ``split_trajs``, then ``postproc``;
- a replay buffer is extended with the batch, and the iterator yields ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase
from torchrl.collectors.utils import split_trajectories

from daskcollect.collection.memmap import MemmapBatch, MemmapLedger, describe_parts
from daskcollect.worker.rollout import Rollout


class Output:
    """Turns rollouts into batches.

    Args:
        sync: Stack one rollout per collector (sync mode), or yield one rollout.
        ledger: The memmap output's ledger, or ``None`` for TensorDicts.
    """

    def __init__(self, sync: bool, ledger: MemmapLedger | None):
        self.sync, self.ledger = sync, ledger

    def emit(
        self,
        rollouts: list[Rollout],
        *,
        replay_buffer: Any = None,
        split_trajs: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
    ) -> TensorDictBase | MemmapBatch | None:
        """The batch of ``rollouts``; ``None`` where a replay buffer took it.

        Args:
            rollouts: One batch's rollouts, in collector order.
            replay_buffer: TorchRL's ``replay_buffer=``: extended, and ``None`` is yielded.
            split_trajs: TorchRL's ``split_trajs=``.
            postproc: TorchRL's ``postproc=``.
        """
        if self.ledger is not None:
            return self._memmap(rollouts, replay_buffer)
        if rollouts[0].batch is None:
            return None  # the collectors extended the cluster's replay buffer themselves
        # Collectors whose batches differ (other agent counts, other keys) stack lazily, as TorchRL's
        # own heterogeneous batches do; alike ones densely, as MultiSyncCollector's stack.
        batch = (
            LazyStackedTensorDict.maybe_dense_stack([r.batch for r in rollouts], 0)
            if self.sync
            else rollouts[0].batch
        )
        if split_trajs:
            batch = split_trajectories(batch)
        if postproc is not None:
            batch = postproc(batch)
        if replay_buffer is not None:
            replay_buffer.extend(batch.reshape(-1) if batch.ndim > 1 else batch)
            return None
        return batch

    def _memmap(self, rollouts: list[Rollout], replay_buffer: Any) -> MemmapBatch | None:
        shape = rollouts[0].batch_size
        size = torch.Size([len(rollouts), *shape]) if self.sync else shape
        handle = self.ledger.track(MemmapBatch(batch_size=size, **describe_parts(rollouts)))
        if replay_buffer is None:
            return handle
        for path in handle.paths:  # extend from the memory map: no copy into RAM first
            replay_buffer.extend(TensorDict.load_memmap(path))
        handle.release()
        return None
