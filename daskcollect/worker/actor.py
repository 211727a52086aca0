"""``CollectorActor``: the long-lived object on each worker around a TorchRL collector.

One actor lives in each worker process (sync actor methods on a worker share
one thread). It builds its envs and policy once, keeps them between rollouts,
loads new weights in place between rollouts, and returns CPU batches whose
trajectory ids are unique across the whole collection.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import inspect
import random
import threading
import time
import traceback
from typing import Any

import cloudpickle
import numpy as np
import torch
from distributed import get_worker
from tensordict import TensorDictBase

from daskcollect import _internals
from daskcollect.collection.memmap import check_writable, write_batch
from daskcollect.errors import RolloutError, SharedFilesystemError
from daskcollect.monitoring.worker import EpisodeTracker, TimeSplit
from daskcollect.streams import local
from daskcollect.streams import worker as stream
from daskcollect.streams.packing import Packer
from daskcollect.weights.payload import WeightsRef
from daskcollect.worker import checkpoint
from daskcollect.worker.checkpoint import Position, Resumed
from daskcollect.worker.layers import scoped_env
from daskcollect.worker.rollout import TRAJ_ID_BITS, ActorSpec, Rollout


class CollectorActor:
    """Hosts one TorchRL collector inside a Dask worker (created with ``actor=True``).

    Args:
        spec: How to label its output.
        recipe: A cloudpickled :class:`~daskcollect.worker.recipe.CollectorRecipe`
            (scattered once by the driver, so Dask resolves it from a future).
    """

    def __init__(self, spec: ActorSpec, recipe: bytes):
        # Rollouts come from the completion stream, the other calls as Dask RPCs; sync ones share
        # Dask's actor thread, and the lock also keeps close() from another thread out.
        self._busy = threading.Lock()
        self._worker = get_worker()  # the worker setup made it serve streams and the weights' tree
        self.spec = spec
        self.where = f"collector {spec.index} on worker {self._worker.address}"
        if spec.memmap_root is not None:
            check_writable(spec.memmap_root, self.where)  # before any rollout
        self.policy_version = 0
        self.rollouts = 0
        #: Namespaces the trajectory ids of the frames made here: this incarnation's uid, or on a
        #: resumed run the one whose trajectories it continues.
        self.namespace = spec.uid
        #: Labels its frames' ``("collector", "collector_id")``: its uid, or a resumed run's new one.
        self.incarnation = spec.uid
        self._positions: dict[int, Position] = {}  # rollouts done -> where the collector stood
        self._recipe = cloudpickle.loads(recipe)
        self._weights: TensorDictBase | None = None  # the last weights loaded, kept for rebuilds
        self._offered: WeightsRef | None = None  # the newest weights the driver announced
        self._shared = spec.shared_memory is not None and spec.shared_memory.matches()
        self._episodes = EpisodeTracker()
        self._split = TimeSplit()
        self._packer = Packer()
        with scoped_env(spec.worker_env):  # its collection's variables, whatever another one set
            self._build()
        if spec.seed is not None:
            self.set_seed(spec.seed)
            with scoped_env(spec.worker_env):
                self._collector.reset()
        self._remember()
        if spec.gc_freeze:
            # Move the long-lived heap (Dask, torch, the envs) out of the
            # collector's way: full collections then scan only rollout garbage.
            gc.freeze()

    # --- weights -----------------------------------------------------------
    def shares_driver_memory(self) -> bool:
        """Whether this worker reads weights from the driver's shared memory."""
        return self._shared

    async def offer_weights(self, ref: WeightsRef) -> None:
        """Announces newer weights; the next rollout to start loads them.

        An ``async`` method: it runs on the worker's event loop at once, even
        while a rollout runs in the actor thread, so calls queued before an
        update still start on the new weights.
        """
        if self._offered is None or ref.version > self._offered.version:
            self._offered = ref

    def _newest(self, carried: WeightsRef | None) -> WeightsRef | None:
        """The newest of the weights a call carries and those announced since."""
        offered = self._offered
        refs = [r for r in (carried, offered) if r is not None and r.version > self.policy_version]
        return max(refs, key=lambda r: r.version, default=None)

    def _load(self, ref: WeightsRef) -> None:
        weights = ref.read(self._worker, self.spec.weights_timeout)
        self._apply(weights)
        self.policy_version = ref.version
        if self.spec.restart_env_on_error:
            self._weights = weights.clone()  # the received memory is not ours to keep

    def _apply(self, weights: TensorDictBase) -> None:
        """Hands ``weights`` to the collector's receiving scheme, and the collector takes them (TorchRL's flow)."""
        if self._receiver is None:
            self._collector.update_policy_weights_(weights)
            return
        self._receiver.deliver(weights)
        self._collector.receive_weights()

    def _build(self) -> None:
        self._collector = self._recipe.build(self.where)
        self._attach_receiver()
        self._split.instrument(self._collector)
        self._episodes.reset()
        self._iterator = iter(self._collector)
        if self._weights is not None:
            self._apply(self._weights)

    def _attach_receiver(self) -> None:
        self._receiver = None
        if self.spec.weight_receiver is not None:
            # A fresh copy per collector built: a scheme binds to the collector it serves.
            self._receiver = copy.deepcopy(self.spec.weight_receiver)
            self._collector.register_scheme_receiver({"policy": self._receiver})

    def rebind(self, spec: ActorSpec) -> None:
        """Serves a new driver (re-attaching): its weights' transports, output and labels, from
        ``spec``; the envs, the policy and the counters stay as they are.

        Raises:
            SharedFilesystemError: If the new driver's memmap folder is not writable here.
        """
        with self._busy:  # after the rollout the old driver may have left running
            if spec.memmap_root is not None:
                check_writable(spec.memmap_root, self.where)
            self.spec = dataclasses.replace(
                spec, index=self.spec.index, uid=self.spec.uid, seed=self.spec.seed
            )
            self._offered = None  # the old driver's announcements point at its transports
            self._shared = spec.shared_memory is not None and spec.shared_memory.matches()
            self._attach_receiver()
            self._positions.clear()
            self._remember()

    def _rebuild_after(self, exc: BaseException) -> str:
        """Drops the broken collector and builds a fresh one (``on_env_error="restart"``)."""
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        try:
            self._collector.shutdown()
        except Exception:  # it is broken already: only its replacement matters
            pass
        self._build()
        return error

    # --- rollouts ----------------------------------------------------------
    def rollout(self, weights: WeightsRef | None = None) -> Rollout:
        """Collects one batch, after loading the newest weights: ``weights``, or newer ones announced.

        Raises:
            RolloutError: With the worker, the collector index and the original
                traceback, if the env or the policy raised.
        """
        with self._busy, scoped_env(self.spec.worker_env):
            return self._rollout(weights)

    def rollout_serialized(self, weights: WeightsRef | None = None, stream_token: int | None = None) -> Any:
        """:meth:`rollout`, packed and serialized for its completion stream here, in the actor's thread.

        The batch travels as one buffer, its schema once per stream (``stream_token``,
        :mod:`daskcollect.streams.packing`); the worker's event loop then only
        writes the frames (see :func:`daskcollect.streams.worker.serialized`).
        """
        return stream.serialized(self._packed_rollout(weights, stream_token))

    def rollout_frames(
        self, weights: WeightsRef | None = None, stream_token: int | None = None, ring: Any = None
    ) -> Any:
        """:meth:`rollout`, packed and encoded here for a same-host channel
        (:mod:`daskcollect.streams.local`), a large batch copied into one of ``ring``'s shared-memory slots."""
        return local.encode({"status": "OK", "result": self._packed_rollout(weights, stream_token)}, ring)

    def _packed_rollout(self, weights: WeightsRef | None, stream_token: int | None) -> Rollout:
        rollout = self.rollout(weights)
        if stream_token is not None and rollout.batch is not None:
            packed = self._packer.pack(rollout.batch, stream_token)
            if packed is not None:
                rollout = dataclasses.replace(rollout, batch=packed)
        return rollout

    def _rollout(self, weights: WeightsRef | None) -> Rollout:
        start, cpu0 = time.perf_counter(), time.thread_time()
        self._split.start()
        try:
            newest = self._newest(weights)
            if newest is not None:
                loading = time.perf_counter()
                self._load(newest)
                self._split.add("weights", time.perf_counter() - loading)
            batch = next(self._iterator)
        except Exception as exc:
            if not self.spec.restart_env_on_error:
                raise RolloutError(
                    f"{self.where}: rollout {self.rollouts} failed with {type(exc).__name__}: "
                    f"{exc}\n\nOriginal traceback (on the worker):\n{traceback.format_exc()}",
                    worker=self._worker.address,
                    index=self.spec.index,
                ) from None
            record = self._record(start, cpu0, error=self._rebuild_after(exc))
            self._remember()
            return record
        episodes = self._episodes.update(batch)
        writing = time.perf_counter()
        out = self._deliver(self._label(batch))
        self._split.add("output", time.perf_counter() - writing)
        record = self._record(start, cpu0, episodes=episodes, **out)
        self._remember()
        return record

    def _deliver(self, batch: TensorDictBase) -> dict[str, Any]:
        """Hands the batch on (returned, written to a memory map, or into the replay buffer)."""
        out: dict[str, Any] = {"frames": batch.numel(), "batch_size": batch.batch_size}
        if self.spec.replay_buffer is not None:
            self._extend_buffer(batch)
        elif self.spec.memmap_root is None:
            out["batch"] = batch
        else:
            out["path"] = self._write(batch)
        return out

    def _label(self, batch: TensorDictBase) -> TensorDictBase:
        """Moves the batch to CPU and writes its provenance into it."""
        if batch.device is None or batch.device.type != "cpu":
            batch = batch.to("cpu")  # CUDA tensors do not serialize
        namespace = self.namespace
        ids = batch.get(("collector", "traj_ids"), None)
        if ids is not None and namespace:
            offset = namespace << TRAJ_ID_BITS
            batch.set(("collector", "traj_ids"), torch.where(ids >= 0, ids + offset, ids))
        if self.spec.trace_frames:
            # Each frame names the collector, incarnation and rollout that made it: a
            # (collector_id, rollout_id) pair is never yielded twice.
            for key, value in (("index", self.spec.index), ("collector_id", self.incarnation),
                               ("rollout_id", self.rollouts)):  # fmt: skip
                batch.set(("collector", key), torch.full(batch.shape, value, dtype=torch.int64))
        if self.spec.track_policy_version:
            version = torch.full(batch.shape, self.policy_version, dtype=torch.int64)
            batch.set("policy_version", version)  # TorchRL's key (its PolicyVersion transform's)
            if "next" in batch.keys():
                batch.set(("next", "policy_version"), version)
        return batch

    def _extend_buffer(self, batch: TensorDictBase) -> None:
        """Extends the cluster's replay buffer from here: the frames never reach the driver."""
        call = self.spec.replay_buffer.extend(batch)
        timeout = self.spec.weights_timeout
        if inspect.isawaitable(call) and not hasattr(call, "result"):
            # The buffer's actor is on this worker: Dask hands its coroutine over directly.
            _internals.sync(self._worker.loop, lambda: call, callback_timeout=timeout)
        else:
            call.result(timeout=timeout)

    def _write(self, batch: TensorDictBase) -> str:
        root = self.spec.memmap_root
        try:
            return write_batch(batch, root, f"c{self.incarnation}-r{self.rollouts}")
        except OSError as exc:
            raise SharedFilesystemError(
                f"{self.where}: writing rollout {self.rollouts} under {root!r} failed ({exc}). "
                "Check the shared filesystem's free space and permissions.",
                path=root,
            ) from None

    def _record(self, start: float, cpu0: float, episodes: tuple | None = None, **fields: Any) -> Rollout:
        """The rollout record (the one place it is built); counts the rollout."""
        seconds = time.perf_counter() - start
        out = Rollout(
            index=self.spec.index,
            uid=self.spec.uid,
            rollout_id=self.rollouts,
            policy_version=self.policy_version,
            seconds=seconds,
            cpu_seconds=time.thread_time() - cpu0,
            episode_returns=episodes[0] if episodes else None,
            episode_lengths=episodes[1] if episodes else None,
            time_split=self._split.finish(seconds),
            **fields,
        )
        self.rollouts += 1
        return out

    # --- state -------------------------------------------------------------
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the envs, torch and NumPy, as a ``MultiSyncCollector`` worker does."""
        with self._busy, scoped_env(self.spec.worker_env):
            out = self._collector.set_seed(seed, static_seed=static_seed)
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
            return out

    def reset(self) -> None:
        """Resets the envs (the next rollout starts new trajectories)."""
        with self._busy, scoped_env(self.spec.worker_env):
            self._collector.reset()
            self._remember()

    def _remember(self) -> None:
        """Async mode: keeps where the collector stands now, once ``self.rollouts`` rollouts are done."""
        if not self.spec.keep_positions:
            return
        self._positions[self.rollouts] = checkpoint.capture(self._collector, self.namespace, generators=False)
        for done in [k for k in self._positions if k < self.rollouts - checkpoint.KEPT]:
            del self._positions[done]

    async def position(self, rollouts: int) -> Position | None:
        """Where the collector stood once ``rollouts`` rollouts were done (``None``: no longer known).

        An ``async`` method: it answers at once, even while a rollout runs.
        """
        return self._positions.get(rollouts)

    def position_now(self) -> tuple[int, Position]:
        """The rollouts done and where the collector stands (sync mode: it is idle between batches)."""
        with self._busy:
            return self.rollouts, checkpoint.capture(self._collector, self.namespace)

    def resume(self, resumed: Resumed) -> None:
        """Continues another incarnation's collection: its trajectories, counters and position.

        Raises:
            ConfigurationError: If the position cannot be restored here.
        """
        with self._busy:
            self.namespace, self.incarnation = resumed.namespace, resumed.incarnation
            self.rollouts, self.policy_version = resumed.rollouts, resumed.policy_version
            checkpoint.restore(self._collector, resumed.position, resumed.restore_env)
            self._episodes.reset()
            self._positions.clear()
            self._remember()

    def load_state_dict(self, state_dict: dict) -> None:
        with self._busy:
            self._collector.load_state_dict(state_dict)

    def close(self) -> None:
        """Shuts the TorchRL collector down (envs and any sub-processes)."""
        with self._busy:
            collector, self._collector = getattr(self, "_collector", None), None
        if collector is not None:
            collector.shutdown()
