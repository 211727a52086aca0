"""Memory-mapped output on a shared filesystem: ``MemmapBatch`` handles.

With ``output="memmap"``, each worker writes its rollout once, with
tensordict's memmap support, under a temporary name inside the collector's own
folder of ``memmap_dir``, then renames it: a folder that a reader can see is a
complete batch. Only a small :class:`MemmapBatch` handle travels to the driver.

The driver's :class:`MemmapLedger` counts the folders on disk, applies the
retention policy, bounds the batches not yet released (back-pressure: no new
rollout starts while the bound is reached), and removes the collector's folder
at shutdown unless asked to keep it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from daskcollect.errors import CollectorTimeoutError, SharedFilesystemError

#: Folders being written start with this prefix; readers never take them for a batch.
TMP_PREFIX = ".tmp-"


def check_writable(path: str, where: str) -> None:
    """Raises :class:`SharedFilesystemError` unless ``path`` is a writable folder.

    Args:
        path: The folder.
        where: Who checks ("the driver", "collector 0 on worker tcp://...").
    """
    if not os.path.isdir(path):
        raise SharedFilesystemError(
            f"{where}: memmap_dir {path!r} does not exist or is not a folder. Pass a folder that the "
            "driver and every worker can see (a shared filesystem such as NFS or FSx for Lustre).",
            path=path,
        )
    probe = os.path.join(path, f"{TMP_PREFIX}probe-{uuid.uuid4().hex}")
    try:
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as exc:
        raise SharedFilesystemError(
            f"{where}: cannot write to memmap_dir {path!r} ({exc}). Give the worker's user write "
            "access to it, or pass another memmap_dir.",
            path=path,
        ) from exc


def write_batch(batch: TensorDictBase, root: str, name: str) -> str:
    """Writes ``batch`` as memory-mapped files under ``root/name``, atomically.

    Returns:
        The final folder.
    """
    final = os.path.join(root, name)
    tmp = os.path.join(root, f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
    batch.memmap(prefix=tmp, copy_existing=True)
    os.rename(tmp, final)  # atomic on POSIX: a visible folder is a complete batch
    return final


@dataclass(frozen=True)
class MemmapBatch:
    """A handle on one yielded batch written to a shared filesystem.

    In async mode a batch is one collector's rollout (one folder). In sync mode
    it is one rollout of every collector (one folder each), and :meth:`load`
    returns their lazy stack ``[num_collectors, ...]``.

    Attributes:
        paths: The batch's folders, one per collector rollout.
        batch_size: The shape that :meth:`load` returns.
        collectors: The collector index of each folder.
        rollout_ids: The rollout counter of each folder's collector.
        policy_versions: The weights version each folder was collected with.
        frames: Frames in the batch.
    """

    paths: tuple[str, ...]
    batch_size: torch.Size
    collectors: tuple[int, ...]
    rollout_ids: tuple[int, ...]
    policy_versions: tuple[int, ...]
    frames: int
    _ledger: MemmapLedger | None = field(default=None, repr=False, compare=False)

    def load(self) -> TensorDictBase:
        """The batch as memory-mapped TensorDicts; no data is read into RAM."""
        parts = [TensorDict.load_memmap(p) for p in self.paths]
        if len(parts) == 1 and len(self.batch_size) == parts[0].ndim:
            return parts[0]
        return LazyStackedTensorDict(*parts, stack_dim=0)

    def release(self) -> None:
        """Deletes the batch's files (per the retention policy); idempotent."""
        if self._ledger is not None:
            self._ledger.release(self)

    @property
    def released(self) -> bool:
        return self._ledger is None or self._ledger.is_released(self)

    def numel(self) -> int:
        return self.frames


class MemmapLedger:
    """Driver-side bookkeeping of the batches on disk (thread-safe).

    Args:
        memmap_dir: The shared folder (checked by the spec, on the driver).
        retention: ``"release"`` (delete on release), ``"keep"`` (never delete)
            or an int ``K`` (delete once ``K`` newer batches were yielded).
        max_unreleased: Bound on rollout folders yielded and not yet released.
    """

    def __init__(self, memmap_dir: str, retention: str | int, max_unreleased: int):
        self.root = os.path.join(memmap_dir, f"daskcollect-{uuid.uuid4().hex[:12]}")
        os.makedirs(self.root)
        self.retention = retention
        self.max_unreleased = max_unreleased
        self._live: dict[tuple[str, ...], MemmapBatch] = {}
        self._order: deque[MemmapBatch] = deque()
        self._cond = threading.Condition()

    def _unreleased(self) -> int:
        # Call with self._cond held.
        return sum(len(b.paths) for b in self._live.values())

    @property
    def unreleased(self) -> int:
        """Rollout folders yielded and not yet released."""
        with self._cond:
            return self._unreleased()

    def track(self, batch: MemmapBatch) -> MemmapBatch:
        """Registers a batch about to be yielded, and applies keep-last-K retention."""
        batch = replace(batch, _ledger=self)
        with self._cond:
            self._live[batch.paths] = batch
            self._order.append(batch)
        if isinstance(self.retention, int):
            while len(self._order) > self.retention:
                self.release(self._order[0])
        return batch

    def is_released(self, batch: MemmapBatch) -> bool:
        with self._cond:
            return batch.paths not in self._live

    def release(self, batch: MemmapBatch) -> None:
        with self._cond:
            if self._live.pop(batch.paths, None) is None:
                return
            self._order.remove(batch)
            self._cond.notify_all()
        if self.retention != "keep":
            for path in batch.paths:
                shutil.rmtree(path, ignore_errors=True)

    def wait_for_room(self, needed: int, in_flight: int, timeout: float) -> None:
        """Waits until ``needed`` more rollouts fit under the bound.

        Raises:
            CollectorTimeoutError: If the batches held by the caller are not
                released within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._unreleased() + in_flight + needed > self.max_unreleased:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CollectorTimeoutError(
                        f"{self.max_unreleased} memmap rollouts are held and not released, so no new "
                        f"rollout may start (waited {timeout:g}s). Call batch.release() when done with "
                        "a batch, or raise max_unreleased= / use memmap_retention=K.",
                    )
                self._cond.wait(min(remaining, 1.0))

    def room(self, in_flight: int) -> int:
        """How many more rollouts may start now."""
        return self.max_unreleased - self.unreleased - in_flight

    def close(self) -> None:
        """Deletes everything this collector wrote, unless retention is ``"keep"``."""
        with self._cond:
            self._live.clear()
            self._order.clear()
            self._cond.notify_all()
        if self.retention != "keep":
            shutil.rmtree(self.root, ignore_errors=True)

    def __repr__(self) -> str:
        return f"MemmapLedger(root={self.root!r}, unreleased={self.unreleased})"


def describe_parts(parts: list[Any]) -> dict[str, Any]:
    """Fields of a :class:`MemmapBatch` from the workers' rollouts, in collector order."""
    return dict(
        paths=tuple(p.path for p in parts),
        collectors=tuple(p.index for p in parts),
        rollout_ids=tuple(p.rollout_id for p in parts),
        policy_versions=tuple(p.policy_version for p in parts),
        frames=sum(p.frames for p in parts),
    )
