"""``CollectorActor``: the long-lived object on each worker around a TorchRL collector.

One actor lives in each worker process (sync actor methods on a worker share
one thread). It builds its envs and policy once, keeps them between rollouts,
loads new weights in place between rollouts, and returns CPU batches whose
trajectory ids are unique across the whole collection.
"""

from __future__ import annotations

import gc
import time
import traceback
from dataclasses import dataclass

import cloudpickle
import numpy as np
import torch
from distributed import get_worker
from distributed.utils import sync
from distributed.worker import get_data_from_worker
from tensordict import TensorDictBase

from daskcollect import config, serialization
from daskcollect.errors import RolloutError, SharedFilesystemError
from daskcollect.memmap import check_writable, write_batch
from daskcollect.sharedmem import MappedFiles, Probe
from daskcollect.weights import WeightsPayload, WeightsRef

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
    """

    index: int
    uid: int
    track_policy_version: bool = False
    memmap_root: str | None = None
    restart_env_on_error: bool = False
    seed: int | None = None
    shared_memory: Probe | None = None


@serialization.register
@dataclass(frozen=True)
class Rollout:
    """One rollout's batch and where it came from.

    Attributes:
        batch: The CPU TensorDict, or ``None`` when it was written to ``path``.
        path: The memory-mapped folder of the batch (``output="memmap"``).
        batch_size: The batch's shape.
        frames: Frames in the batch.
        index: The collector's slot.
        uid: The actor incarnation that made it.
        rollout_id: The actor's rollout counter (0-based).
        policy_version: The weights version the batch was collected with.
        seconds: Wall time of the rollout on the worker.
        cpu_seconds: CPU time of the rollout thread (``seconds`` minus this is
            time spent waiting for the GIL or a core).
        error: With ``on_env_error="restart"``: the error that ended this
            rollout (its frames are dropped whole, and the collector was rebuilt).
    """

    batch: TensorDictBase | None
    path: str | None
    batch_size: torch.Size
    frames: int
    index: int
    uid: int
    rollout_id: int
    policy_version: int
    seconds: float
    cpu_seconds: float
    error: str | None = None


class CollectorActor:
    """Hosts one TorchRL collector inside a Dask worker (created with ``actor=True``).

    Args:
        spec: How to label its output.
        recipe: A cloudpickled :class:`~daskcollect.recipe.CollectorRecipe`
            (scattered once by the driver, so Dask resolves it from a future).
    """

    def __init__(self, spec: ActorSpec, recipe: bytes):
        self._worker = get_worker()
        self.index = spec.index
        self.uid = spec.uid
        self.where = f"collector {spec.index} on worker {self._worker.address}"
        self._track_version = spec.track_policy_version
        self._traj_offset = spec.uid << TRAJ_ID_BITS
        self._memmap_root = spec.memmap_root
        if self._memmap_root is not None:
            check_writable(self._memmap_root, self.where)  # before any rollout
        self.policy_version = 0
        self.rollouts = 0
        self.frames = 0
        self.env_restarts = 0
        self._restart_on_error = spec.restart_env_on_error
        self._recipe = cloudpickle.loads(recipe)
        self._weights: TensorDictBase | None = None  # the last weights loaded, kept for rebuilds
        self._shared = spec.shared_memory is not None and spec.shared_memory.matches()
        self._mapped = MappedFiles()
        self._build()
        if spec.seed is not None:
            self.set_seed(spec.seed)
            self._collector.reset()
        if config.get("worker.gc-freeze"):
            # Move the long-lived heap (Dask, torch, the envs) out of the
            # collector's way: full collections then scan only rollout garbage.
            gc.freeze()

    # --- weights -----------------------------------------------------------
    def shares_driver_memory(self) -> bool:
        """Whether this worker reads weights from the driver's shared memory."""
        return self._shared

    def _fetch(self, ref: WeightsRef) -> WeightsPayload:
        if ref.path is not None:
            return self._mapped.read(ref)
        try:
            return self._worker.data[ref.key]
        except KeyError:
            # Not replicated here (e.g. dropped by the Active Memory Manager): fetch it
            # from a worker that holds it. (A Future made in an actor thread never
            # resolves: tried, it waits until its timeout.)
            return sync(
                self._worker.loop, self._fetch_remote, ref.key, callback_timeout=config.timeout("weights")
            )

    async def _fetch_remote(self, key: str) -> WeightsPayload:
        worker = self._worker
        holders = (await worker.scheduler.who_has(keys=[key])).get(key, [])
        for address in holders:
            response = await get_data_from_worker(worker.rpc, [key], address, who=worker.address)
            if response.get("status") == "OK" and key in response["data"]:
                return response["data"][key]
        raise KeyError(f"weights {key} are held by no live worker ({holders})")

    def _load(self, ref: WeightsRef) -> None:
        payload = self._fetch(ref)
        weights = payload.to_tensordict()
        self._collector.update_policy_weights_(weights)
        self.policy_version = ref.version
        if self._restart_on_error:
            self._weights = weights.clone()  # the payload's memory belongs to Dask

    def _build(self) -> None:
        self._collector = self._recipe.build(self.where)
        self._iterator = iter(self._collector)
        if self._weights is not None:
            self._collector.update_policy_weights_(self._weights)

    def _rebuild_after(self, exc: BaseException) -> str:
        """Drops the broken collector and builds a fresh one (``on_env_error="restart"``)."""
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        try:
            self._collector.shutdown()
        except Exception:  # it is broken already: only its replacement matters
            pass
        self._build()
        self.env_restarts += 1
        return error

    # --- rollouts ----------------------------------------------------------
    def rollout(self, weights: WeightsRef | None = None) -> Rollout:
        """Collects one batch, after loading ``weights`` if they are newer.

        Raises:
            RolloutError: With the worker, the collector index and the original
                traceback, if the env or the policy raised.
        """
        start = time.perf_counter()
        cpu0 = time.thread_time()
        try:
            if weights is not None and weights.version != self.policy_version:
                self._load(weights)
            batch = next(self._iterator)
        except Exception as exc:
            if self._restart_on_error:
                error = self._rebuild_after(exc)
                out = Rollout(
                    None, None, torch.Size([]), 0, self.index, self.uid, self.rollouts,
                    self.policy_version, time.perf_counter() - start, time.thread_time() - cpu0, error,
                )  # fmt: skip
                self.rollouts += 1
                return out
            raise RolloutError(
                f"{self.where}: rollout {self.rollouts} failed with {type(exc).__name__}: "
                f"{exc}\n\nOriginal traceback (on the worker):\n{traceback.format_exc()}",
                worker=self._worker.address,
                index=self.index,
            ) from None
        if batch.device is None or batch.device.type != "cpu":
            batch = batch.to("cpu")  # CUDA tensors do not serialize
        ids = batch.get(("collector", "traj_ids"), None)
        if ids is not None and self._traj_offset:
            batch.set(("collector", "traj_ids"), torch.where(ids >= 0, ids + self._traj_offset, ids))
        # Each frame names the actor incarnation and rollout that made it: a
        # (collector_id, rollout_id) pair is never yielded twice.
        batch.set(("collector", "collector_id"), torch.full(batch.shape, self.uid, dtype=torch.int64))
        batch.set(("collector", "rollout_id"), torch.full(batch.shape, self.rollouts, dtype=torch.int64))
        if self._track_version:
            batch.set("policy_version", torch.full(batch.shape, self.policy_version, dtype=torch.int64))
        frames, batch_size, path = batch.numel(), batch.batch_size, None
        if self._memmap_root is not None:
            try:
                path = write_batch(batch, self._memmap_root, f"c{self.uid}-r{self.rollouts}")
            except OSError as exc:
                raise SharedFilesystemError(
                    f"{self.where}: writing rollout {self.rollouts} under {self._memmap_root!r} "
                    f"failed ({exc}). Check the shared filesystem's free space and permissions.",
                    path=self._memmap_root,
                ) from None
            batch = None
        out = Rollout(
            batch,
            path,
            batch_size,
            frames,
            self.index,
            self.uid,
            self.rollouts,
            self.policy_version,
            time.perf_counter() - start,
            time.thread_time() - cpu0,
        )
        self.rollouts += 1
        self.frames += frames
        return out

    # --- state -------------------------------------------------------------
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the envs, torch and NumPy, as a ``MultiSyncCollector`` worker does."""
        out = self._collector.set_seed(seed, static_seed=static_seed)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        return out

    def reset(self) -> None:
        """Resets the envs (the next rollout starts new trajectories)."""
        self._collector.reset()

    def state_dict(self) -> dict:
        return self._collector.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._collector.load_state_dict(state_dict)

    def close(self) -> None:
        """Shuts the TorchRL collector down (envs and any sub-processes)."""
        collector, self._collector = getattr(self, "_collector", None), None
        self._mapped.clear()
        if collector is not None:
            collector.shutdown()
