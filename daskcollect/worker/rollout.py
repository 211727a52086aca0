"""How to start one collector actor, and the record one rollout call returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from tensordict import TensorDictBase

from daskcollect.weights.shm import Probe

#: Trajectory ids of collector ``uid`` live in ``[uid << TRAJ_ID_BITS, (uid + 1) << TRAJ_ID_BITS)``.
TRAJ_ID_BITS = 32


@dataclass(frozen=True)
class ActorSpec:
    """How to start one actor.

    Attributes:
        index: The collector's slot (0..num_collectors-1).
        uid: Unique id of this actor incarnation; it namespaces trajectory ids.
        track_policy_version: Write ``"policy_version"`` into each batch.
        memmap_root: With ``output="memmap"``, the folder (on a shared
            filesystem) where rollouts are written; ``None`` returns batches.
        restart_env_on_error: Rebuild the collector when a rollout raises
            (``on_env_error="restart"``) instead of raising.
        seed: Seed the envs with it once built (replacement collectors).
        shared_memory: The driver's shared-memory probe: an actor that reads it
            gets its weights from the driver's shared memory.
        weights_timeout: Bound, in seconds, on fetching weights from a peer
            (and on extending ``replay_buffer``).
        gc_freeze: ``gc.freeze()`` once the collector is built.
        replay_buffer: The actor of a :class:`~daskcollect.DaskReplayBuffer`:
            each rollout extends it from here, and only its record goes back.
        trace_frames: Label each frame with ``("collector", "index")``,
            ``"collector_id"`` (the incarnation) and ``"rollout_id"``.
        keep_positions: Keep the collector's position after each rollout,
            for checkpoints in async mode (:mod:`daskcollect.worker.checkpoint`).
        weight_receiver: The receiving side of the weight-sync scheme, a
            copy of which is registered on each TorchRL collector built
            here; ``None`` when updates are off.
        worker_env: Its collection's ``worker_env``, set on top of the
            worker's variables while it builds and collects
            (:func:`daskcollect.worker.layers.scoped_env`).
    """

    index: int
    uid: int
    track_policy_version: bool = False
    memmap_root: str | None = None
    restart_env_on_error: bool = False
    seed: int | None = None
    shared_memory: Probe | None = None
    weights_timeout: float = 60.0
    gc_freeze: bool = True
    replay_buffer: Any = None
    trace_frames: bool = True
    keep_positions: bool = False
    weight_receiver: Any = None
    worker_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rollout:
    """One rollout's batch and where it came from.

    Attributes:
        index: The collector's slot.
        uid: The actor incarnation that made it.
        rollout_id: The actor's rollout counter (0-based).
        policy_version: The weights version the batch was collected with.
        seconds: Wall time of the rollout on the worker.
        cpu_seconds: CPU time of the rollout thread (``seconds`` minus this is
            time spent waiting for the GIL or a core).
        batch: The CPU TensorDict, or ``None`` when it was written to ``path``
            or the rollout failed.
        path: The memory-mapped folder of the batch (``output="memmap"``).
        batch_size: The batch's shape.
        frames: Frames in the batch.
        error: With ``on_env_error="restart"``: the error that ended this
            rollout (its frames are dropped whole, and the collector was rebuilt).
        episode_returns: Returns of the episodes that ended in this rollout
            (carried across rollouts per env), or ``None`` when the batch has
            no ``("next", "reward")`` / ``("next", "done")``.
        episode_lengths: Their lengths in steps.
        time_split: Seconds of the rollout spent in each of
            :data:`~daskcollect.monitoring.stats.TIME_PARTS`.
    """

    index: int
    uid: int
    rollout_id: int
    policy_version: int
    seconds: float
    cpu_seconds: float
    batch: TensorDictBase | None = None
    path: str | None = None
    batch_size: torch.Size = torch.Size([])
    frames: int = 0
    error: str | None = None
    episode_returns: tuple[float, ...] | None = None
    episode_lengths: tuple[int, ...] | None = None
    time_split: dict[str, float] | None = None

    def __reduce__(self) -> tuple:
        # Its fields in order, rebuilt by the constructor: a frozen dataclass's default pickling sets a
        # state dict attribute by attribute, which cost the driver's event loop more than the record.
        return Rollout, tuple(getattr(self, name) for name in _ROLLOUT_FIELDS)


_ROLLOUT_FIELDS = tuple(f.name for f in fields(Rollout))
