"""The shared-memory transport: one write per version for every worker on the driver's host.

A network transfer per worker costs CPU on both ends, and on one host the
workers share those cores: eight loopback transfers of 100 MB cost about nine
times one (docs/benchmarks.md, P3). Workers that share the driver's host need
no transfer at all: the driver packs each weights version once, with
``TensorDict.consolidate(filename=...)``, into a file in shared memory
(``/dev/shm``), and each of those workers reads it with
``TensorDict.from_consolidated`` and copies it into its policy, as TorchRL's
multiprocess collectors share their policy's weights.

Whether a worker shares the driver's shared memory is checked, not guessed:
the driver writes a probe file with a random token and each actor reads it
(containers on one host may not share ``/dev/shm``).

The files form a small ring: a :class:`SharedWeights` handle owns its file
until the handle is garbage (no rollout call in flight and no collector still
waiting for those weights refers to it); then the file takes the next version
of the same shapes in place. The folder is removed at :meth:`SharedMemoryTransport.close`,
and folders left by dead drivers are removed when the next one starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDict, TensorDictBase

from daskcollect.weights.payload import Sent, WeightsPayload

logger = logging.getLogger(__name__)

ROUTE = "shared-memory"
_PREFIX = "daskcollect-"


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
class SharedMemoryRef:
    """A weights version in a shared-memory file on the driver's host."""

    version: int
    path: str

    def read(self, worker: Any, timeout: float) -> TensorDictBase:
        """Maps the file (no copy); valid while the call carrying this ref runs."""
        return TensorDict.from_consolidated(self.path)


class SharedWeights:
    """Keeps one file of the ring from being reused while referenced; returns it once garbage."""

    def __init__(self, path: str, release):
        self.path = path
        weakref.finalize(self, release, path)


def _signature(weights: TensorDictBase) -> tuple:
    """Files are reused by weights of the same keys, shapes and dtypes (hence the same size)."""
    return tuple(
        (key, tuple(t.shape), t.dtype) for key, t in weights.items(include_nested=True, leaves_only=True)
    )


class SharedMemoryTransport:
    """The driver's folder of weights files in shared memory.

    Use :meth:`create`, which returns ``None`` where shared memory is off or missing.
    """

    route = ROUTE

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
        self._free: dict[tuple, list[str]] = {}  # signature -> files no handle owns
        self._signatures: dict[str, tuple] = {}
        self._count = 0
        self._closed = False

    @classmethod
    def create(cls, root: str | None) -> SharedMemoryTransport | None:
        """A new folder under ``root``, or ``None`` if ``root`` is unset or missing."""
        if not root or not os.path.isdir(root):
            return None
        remove_stale(root)
        try:
            return cls(root)
        except OSError as exc:
            logger.info("weights go through Dask only: cannot use %s (%s)", root, exc)
            return None

    def send(self, weights: TensorDictBase, version: int, addresses: list[str]) -> Sent | None:
        """Packs ``weights`` once into a file; ``None`` if shared memory lacks the room.

        ``addresses`` need not be told: they read the file when a call carries its ref.
        """
        signature = _signature(weights)
        with self._lock:
            if self._closed:
                return None
            free = self._free.get(signature)
            path = free.pop() if free else None
            if path is None:
                # Room for this file and for the next version while this one is in use.
                size = weights.bytes()
                if shutil.disk_usage(self.path).free < 3 * size:
                    logger.info("weights go through Dask: %s has no room for %d bytes", self.path, size)
                    return None
                self._count += 1
                path = os.path.join(self.path, f"weights-{self._count}")
                self._signatures[path] = signature
        payload = WeightsPayload.pack(weights, version, filename=path)
        return Sent(SharedMemoryRef(version, path), payload, SharedWeights(path, self._release), ROUTE)

    def _release(self, path: str) -> None:
        with self._lock:
            if not self._closed and path in self._signatures:
                self._free.setdefault(self._signatures[path], []).append(path)

    def close(self) -> None:
        """Removes the folder (idempotent). Workers' mappings stay valid until they drop them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._free.clear()
            self._signatures.clear()
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
