"""Weights through host-local shared memory, for workers on the driver's host.

A network transfer per worker costs CPU on both ends, and on one host the
workers share those cores: eight loopback transfers of 100 MB cost about nine
times one (docs/benchmarks.md, P3). Workers that share the driver's host need
no transfer at all: the driver writes each weights version once into a file in
shared memory (``/dev/shm``), and each of those workers copies it into its
policy from a mapping of that file, as TorchRL's multiprocess collectors share
their policy's weights. Workers on other hosts get the weights through Dask
(:meth:`~daskcollect.pool.ActorPool.scatter_weights`).

Whether a worker shares the driver's shared memory is checked, not guessed:
the driver writes a probe file with a random token and each actor reads it
(containers on one host may not share ``/dev/shm``).

The files form a small ring: a :class:`SharedWeights` handle owns its file
until the handle is garbage (no rollout call in flight and no collector still
waiting for those weights refers to it); then the file takes the next version
in place, so neither side pays to map fresh pages. The folder is removed at
:meth:`SharedWeightsDir.close`, and folders left by dead drivers are removed
when the next one starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from daskcollect import config
from daskcollect.weights import WeightsPayload, WeightsRef

logger = logging.getLogger(__name__)

_PREFIX = "daskcollect-"
_ALIGN = 64  # each tensor starts on a cache line


@dataclass(frozen=True)
class Probe:
    """What an actor reads to learn whether it shares the driver's shared memory."""

    path: str
    token: str

    def matches(self) -> bool:
        try:
            with open(self.path) as f:
                return f.read() == self.token
        except OSError:
            return False


@dataclass(frozen=True)
class Layout:
    """Where each tensor of a payload lies in a shared weights file."""

    keys: tuple
    dtypes: tuple
    shapes: tuple
    offsets: tuple
    sizes: tuple

    @classmethod
    def of(cls, payload: WeightsPayload) -> Layout:
        offsets, sizes, end = [], [], 0
        for buf in payload.buffers:
            end = -(-end // _ALIGN) * _ALIGN
            offsets.append(end)
            sizes.append(buf.nbytes)
            end += buf.nbytes
        return cls(payload.keys, payload.dtypes, payload.shapes, tuple(offsets), tuple(sizes))

    @property
    def nbytes(self) -> int:
        return max(self.offsets[-1] + self.sizes[-1], 1) if self.offsets else 1

    def views(self, mapping: np.ndarray) -> tuple:
        return tuple(mapping[o : o + n] for o, n in zip(self.offsets, self.sizes))

    def payload(self, version: int, buffers: tuple) -> WeightsPayload:
        """The payload of ``buffers`` laid out as described here."""
        return WeightsPayload(version, self.keys, self.dtypes, self.shapes, buffers)


class SharedWeights:
    """One weights version in a shared-memory file; the file is reused once this is garbage.

    Args:
        path: The file.
        layout: Where each tensor lies in it.
        version: The weights version written.
        mapping: The driver's writable mapping of the file.
        release: Called with the path once this handle is garbage.
    """

    def __init__(self, path: str, layout: Layout, version: int, mapping: np.ndarray, release):
        self.path, self.layout, self.version = path, layout, version
        self._mapping = mapping
        weakref.finalize(self, release, path)

    def ref(self) -> WeightsRef:
        """What a rollout call carries to a worker on the driver's host."""
        return WeightsRef(None, self.version, path=self.path, layout=self.layout)

    def result(self, timeout: float | None = None) -> WeightsPayload:
        """A copy of the weights (like ``Future.result``: to send them to a new actor)."""
        return self.layout.payload(self.version, tuple(v.copy() for v in self.layout.views(self._mapping)))


class SharedWeightsDir:
    """The driver's folder of weights files in shared memory.

    Use :meth:`create`, which returns ``None`` where shared memory is off or missing.
    """

    def __init__(self, root: str):
        self.path = os.path.join(root, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.makedirs(self.path, mode=0o700)
        token = uuid.uuid4().hex
        probe = os.path.join(self.path, "probe")
        with open(probe, "w") as f:
            f.write(token)
        self.probe = Probe(probe, token)
        # Reentrant: a handle's finalizer (which takes it) may run on a thread that holds it.
        self._lock = threading.RLock()
        self._free: dict[int, list[str]] = {}  # size -> files no handle owns
        self._maps: dict[str, np.ndarray] = {}
        self._count = 0
        self._closed = False

    @classmethod
    def create(cls) -> SharedWeightsDir | None:
        """A new folder under ``daskcollect.weights.shared-memory-dir``, or ``None`` if off or missing."""
        root = config.get("weights.shared-memory-dir")
        if not config.get("weights.shared-memory") or not root or not os.path.isdir(root):
            return None
        remove_stale(root)
        try:
            return cls(root)
        except OSError as exc:
            logger.info("weights go through Dask only: cannot use %s (%s)", root, exc)
            return None

    def write(self, payload: WeightsPayload) -> SharedWeights | None:
        """Writes ``payload`` once; ``None`` if shared memory lacks the room (send through Dask then)."""
        layout = Layout.of(payload)
        size = layout.nbytes
        with self._lock:
            if self._closed:
                return None
            path = self._free.get(size, []).pop() if self._free.get(size) else None
            if path is None:
                # Room for this file and for the next version while this one is in use.
                if shutil.disk_usage(self.path).free < 3 * size:
                    logger.info("weights go through Dask: %s has no room for %d bytes", self.path, size)
                    return None
                self._count += 1
                path = os.path.join(self.path, f"weights-{self._count}")
                with open(path, "wb") as f:
                    f.truncate(size)
                self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r+", shape=(size,))
            mapping = self._maps[path]
        for view, buf in zip(layout.views(mapping), payload.buffers):
            view[:] = np.frombuffer(buf, dtype=np.uint8)
        return SharedWeights(path, layout, payload.version, mapping, self._release)

    def _release(self, path: str) -> None:
        with self._lock:
            if not self._closed and path in self._maps:
                self._free.setdefault(self._maps[path].size, []).append(path)

    def close(self) -> None:
        """Removes the folder (idempotent). Workers' mappings stay valid until they drop them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._maps.clear()
            self._free.clear()
        shutil.rmtree(self.path, ignore_errors=True)


def remove_stale(root: str) -> None:
    """Removes folders that drivers now dead left in ``root`` (killed before their ``close``)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith(_PREFIX):
                continue
            pid = name[len(_PREFIX) :].split("-", 1)[0]
            if not pid.isdigit() or pid == str(os.getpid()):
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            except OSError:  # alive, or not ours
                pass


class MappedFiles:
    """Worker side: read-only mappings of the driver's weights files, kept between versions."""

    def __init__(self, keep: int = 4):
        self._maps: OrderedDict[str, np.ndarray] = OrderedDict()
        self._keep = keep

    def read(self, ref: WeightsRef) -> WeightsPayload:
        """The payload of ``ref`` as views of the mapped file (valid while the call carrying it runs)."""
        mapping = self._maps.pop(ref.path, None)
        if mapping is None or mapping.size != ref.layout.nbytes:
            mapping = np.memmap(ref.path, dtype=np.uint8, mode="r", shape=(ref.layout.nbytes,))
        self._maps[ref.path] = mapping
        while len(self._maps) > self._keep:
            self._maps.popitem(last=False)
        return ref.layout.payload(ref.version, ref.layout.views(mapping))

    def clear(self) -> None:
        self._maps.clear()
