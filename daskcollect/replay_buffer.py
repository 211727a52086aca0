"""``DaskReplayBuffer``: a TorchRL ``ReplayBuffer`` that lives in an actor on a Dask worker.

The Dask counterpart of TorchRL's ``RayReplayBuffer``. Any storage, sampler and
writer works, ``LazyMemmapStorage`` on a shared folder included: the buffer is
built on the worker from the given parts. Collectors given
``replay_buffer=DaskReplayBuffer(...)`` extend it worker to worker, so the
frames never pass through the driver; the learner calls :meth:`sample`,
:meth:`extend`, ``len()``, and :meth:`state_dict` / :meth:`load_state_dict`
for checkpoints. Every call is bounded; a lost worker is a
:class:`~daskcollect.errors.ReplayBufferLostError`, never a hang.

The actor's methods are ``async``: they run on the worker's event loop, so a
buffer on a worker that also hosts a collector is never queued behind a
rollout in the actor thread.
"""

from __future__ import annotations

import sys
import uuid
import warnings
from typing import Any

import cloudpickle

from daskcollect.collection.options import ClusterOptions
from daskcollect.deploy.handle import ClusterHandle, close_at_exit, connect
from daskcollect.deploy.workers import wait_for_workers
from daskcollect.errors import ConfigurationError, ReplayBufferLostError
from daskcollect.settings import Settings
from daskcollect.streams.serialization import register_serializers
from daskcollect.worker.plugin import WorkerSetup

#: Keys of buffer actors start with this.
BUFFER_KEY_PREFIX = "daskcollect-buffer-"


class BufferActor:
    """Hosts one TorchRL ``ReplayBuffer`` in a worker (created with ``actor=True``).

    Args:
        recipe: The cloudpickled keyword arguments of ``ReplayBuffer``.
    """

    def __init__(self, recipe: bytes):
        from torchrl.data import ReplayBuffer

        self.buffer = ReplayBuffer(**cloudpickle.loads(recipe))

    async def extend(self, data: Any) -> Any:
        if data.ndim > 1:
            data = data.reshape(-1)
        return self.buffer.extend(data)

    async def add(self, data: Any) -> Any:
        return self.buffer.add(data)

    async def sample(self, batch_size: int | None = None) -> Any:
        return self.buffer.sample(batch_size)

    async def size(self) -> int:
        return len(self.buffer)

    async def state_dict(self) -> dict:
        return self.buffer.state_dict()

    async def load_state_dict(self, state_dict: dict) -> None:
        self.buffer.load_state_dict(state_dict)


class DaskReplayBuffer:
    """A TorchRL ``ReplayBuffer`` on a Dask worker, extended by collectors worker to worker.

    Args:
        storage, sampler, writer, batch_size: As for ``torchrl.data.ReplayBuffer``.
        client: A ``distributed.Client``, a scheduler address, or ``None``
            with ``scheduler_file``. The buffer needs a running cluster: give
            the same one as to the collectors.
        scheduler_file: A scheduler file, instead of ``client``.
        address: The worker to host the buffer; default the first worker that
            declares ``worker_resources``.
        worker_resources: Resources the hosting worker must declare, e.g. ``{"memory-node": 1}``.
        security: A ``distributed.security.Security`` for TLS clusters.
        **kwargs: Further keywords of ``ReplayBuffer`` (``transform``,
            ``prefetch``...), pickled and used on the worker.

    Raises:
        ConfigurationError: Without a cluster, or with parts that cannot be pickled.
        ReplayBufferLostError: If the buffer cannot be built on the worker.
    """

    def __init__(
        self,
        *,
        storage: Any = None,
        sampler: Any = None,
        writer: Any = None,
        batch_size: int | None = None,
        client: Any = None,
        scheduler_file: str | None = None,
        address: str | None = None,
        worker_resources: dict[str, float] | None = None,
        security: Any = None,
        **kwargs: Any,
    ):
        self._closed = True
        if client is None and scheduler_file is None:
            raise ConfigurationError(
                "DaskReplayBuffer needs the cluster that its collectors use: pass client= (a Client or "
                "a scheduler address) or scheduler_file=."
            )
        self.settings = Settings.load()
        parts = dict(storage=storage, sampler=sampler, writer=writer, batch_size=batch_size, **kwargs)
        try:
            recipe = cloudpickle.dumps({k: v for k, v in parts.items() if v is not None})
        except Exception as exc:
            raise ConfigurationError(
                f"The replay buffer's parts cannot be pickled for the worker ({type(exc).__name__}: {exc})."
            ) from exc
        register_serializers()
        options = ClusterOptions(client, scheduler_file, {}, worker_resources, security)
        self._handle: ClusterHandle = connect(options, n_workers=1, settings=self.settings)
        self._closed = False
        close_at_exit(self.close)
        try:
            self._start(recipe, address, worker_resources)
        except BaseException:
            self.close()
            raise

    def _start(self, recipe: bytes, address: str | None, resources: dict | None) -> None:
        client, timeouts = self._handle.client, self.settings.timeouts
        if address is None:
            address = wait_for_workers(client, 1, resources, timeouts.workers)[0]
        self._handle.register_plugin(
            WorkerSetup({}, self.settings.worker), name=f"daskcollect-buffer-{id(self):x}"
        )
        future = client.submit(
            BufferActor, recipe, actor=True, workers=[address], allow_other_workers=False,
            pure=False, key=f"{BUFFER_KEY_PREFIX}{uuid.uuid4().hex[:12]}",
        )  # fmt: skip
        try:
            with client.as_current():  # the actor's handle binds to our client
                self.actor = future.result(timeout=timeouts.actor_start)
        except Exception as exc:
            raise ReplayBufferLostError(
                f"The replay buffer could not be built on {address} ({type(exc).__name__}: {exc}). Check "
                "its storage, sampler and writer, and that the worker can write the storage's folder.",
                worker=address,
            ) from exc
        self._future, self.address = future, address

    def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise ReplayBufferLostError("This DaskReplayBuffer was closed.", worker=None)
        timeout = self.settings.timeouts.call
        try:
            return getattr(self.actor, method)(*args).result(timeout=timeout)
        except (OSError, TimeoutError, RuntimeError) as exc:
            raise ReplayBufferLostError(
                f"The replay buffer on {self.address} did not answer {method}() within {timeout:g}s "
                f"({type(exc).__name__}: {exc}). Its worker is gone or stuck, and its data with it: "
                "restore it from a checkpoint (state_dict()) on a live worker.",
                worker=self.address,
            ) from exc

    def extend(self, data: Any) -> Any:
        """Adds a batch of frames (flattened to one dimension); returns their indices."""
        return self._call("extend", data)

    def add(self, data: Any) -> Any:
        """Adds one frame; returns its index."""
        return self._call("add", data)

    def sample(self, batch_size: int | None = None) -> Any:
        """Samples a batch (of ``batch_size``, or the buffer's own)."""
        return self._call("sample", batch_size)

    def __len__(self) -> int:
        return int(self._call("size"))

    def state_dict(self) -> dict:
        """The buffer's state, for a checkpoint."""
        return self._call("state_dict")

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a checkpoint taken with :meth:`state_dict`."""
        self._call("load_state_dict", state_dict)

    def close(self) -> None:
        """Deletes the buffer's actor and closes our client (idempotent); the cluster stays."""
        if self._closed:
            return
        self._closed = True
        future = getattr(self, "_future", None)
        if future is not None:
            try:
                self._handle.client.cancel([future])
            except Exception:  # the worker is gone already: nothing to delete
                pass
        self._handle.close(self.settings.timeouts.shutdown)

    def __enter__(self) -> DaskReplayBuffer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("A DaskReplayBuffer is used from the driver; collectors get its actor handle.")

    def __del__(self, _warn=warnings.warn, _finalizing=sys.is_finalizing):
        if getattr(self, "_closed", True) is False and not _finalizing():
            _warn("A DaskReplayBuffer was not closed; call close() or use it as a context manager.",
                  ResourceWarning, stacklevel=2)  # fmt: skip
