"""The audit of a resumed run's frames (tests/test_collection_checkpoint.py, tests/test_reattach.py).

Exactly ``total_frames`` frames, no ``(collector_id, rollout_id)`` pair twice,
and every trajectory's transitions consecutive (each frame's ``next`` state is
the following frame's state).
"""

from __future__ import annotations

import os

import torch
from resumable_driver import FRAMES_PER_BATCH
from tensordict import TensorDict


def flat(batches: list[TensorDict]) -> TensorDict:
    """Every frame, collector by collector, in the order each collector made them."""
    if batches[0].ndim == 2:  # sync: [collectors, time]
        return torch.cat([torch.cat([b[i] for b in batches]) for i in range(batches[0].shape[0])])
    return torch.cat(batches)


def audit(batches: list[TensorDict], total: int) -> None:
    """Exact total, no frame twice, and consecutive transitions within every trajectory."""
    frames = flat(batches)
    assert frames.numel() == total
    made = list(zip(frames["collector", "collector_id"].tolist(), frames["collector", "rollout_id"].tolist()))
    rollouts = {}
    for pair in made:
        rollouts[pair] = rollouts.get(pair, 0) + 1
    assert all(n == FRAMES_PER_BATCH // (2 if batches[0].ndim == 2 else 1) for n in rollouts.values())
    traj = frames["collector", "traj_ids"]
    for tid in traj.unique().tolist():
        steps = frames[traj == tid]
        assert torch.equal(steps["next", "th"][:-1], steps["th"][1:]), f"trajectory {tid} has a gap"
        assert torch.equal(steps["next", "thdot"][:-1], steps["thdot"][1:]), f"trajectory {tid} has a gap"


def saved_batches(folder: str) -> list[TensorDict]:
    names = sorted(n for n in os.listdir(folder) if n.startswith("batch-"))
    return [torch.load(os.path.join(folder, n), weights_only=False) for n in names]
