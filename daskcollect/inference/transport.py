"""TorchRL's ``InferenceTransport`` over Dask comms: env steps on collector workers, the policy on servers.

Each env-only collector holds a :class:`DaskInferenceClient` as its policy
(wrapped in TorchRL's ``PolicyClientModule``). On its first call, in the
collector's worker, the client opens one Dask comm to its inference server's
worker (``distributed.comm.connect`` with the worker's connection arguments:
TCP, TLS or any Dask comm backend) and sends ``{"op": "daskcollect_infer"}``;
the server's worker hands the comm to :func:`install`'s handler. Requests
(``{"id", "td"}``) go out from the collector's thread through the worker's
event loop; answers come back on the same comm, each resolving the request's
``concurrent.futures.Future``.

On the server, requests enter a :class:`ServerTransport`, which is what
TorchRL's ``InferenceServer`` drains, batches and answers through
(:meth:`ServerTransport.resolve`). The same completion-stream
:class:`~daskcollect.worker.stream.Sender` coalesces the answers that finish
while one is being written.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

from distributed import get_worker
from distributed.comm import connect
from distributed.core import Status
from distributed.protocol import to_serialize
from tensordict import TensorDictBase
from torchrl.modules.inference_server import InferenceTransport

from daskcollect import _internals
from daskcollect.errors import InferenceServerLostError
from daskcollect.worker.stream import Sender

logger = logging.getLogger(__name__)

#: The worker request that turns a fresh comm into an inference channel.
OPEN = "daskcollect_infer"
#: The transports served in this worker process, by server name.
SERVING: dict[str, ServerTransport] = {}
#: Seconds from request to answer of this process's recent requests, per server name (the last 4096).
LATENCIES: dict[str, deque] = {}


def latencies(dask_worker: Any = None) -> dict[str, list[float]]:
    """This process's recent action latencies, per server (``Client.run`` it on the collectors' workers)."""
    return {name: list(values) for name, values in LATENCIES.items()}


class ServerTransport(InferenceTransport):
    """The server's end: requests queued by the worker's event loop, drained by TorchRL's server thread."""

    _clients_require_registration = False

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._peeked: tuple | None = None

    def put(self, td: TensorDictBase, callback: Any) -> None:
        """Queues one request (event loop); ``callback`` is ``(loop, sender, request id)``."""
        self._queue.put((td, callback, time.monotonic()))

    def submit(self, td: TensorDictBase) -> Future:
        raise RuntimeError("Requests reach a Dask inference server through DaskInferenceClient.")

    def wait_for_work(self, timeout: float) -> None:
        if self._peeked is None:
            try:
                self._peeked = self._queue.get(timeout=timeout)
            except queue.Empty:
                pass

    def drain_with_timing(self, max_items: int) -> tuple[list, list, list]:
        """Up to ``max_items`` requests, their callbacks and their arrival times (TorchRL's hook)."""
        taken = []
        if self._peeked is not None:
            taken.append(self._peeked)
            self._peeked = None
        while len(taken) < max_items:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return [t[0] for t in taken], [t[1] for t in taken], [t[2] for t in taken]

    def drain(self, max_items: int) -> tuple[list, list]:
        items, callbacks, _ = self.drain_with_timing(max_items)
        return items, callbacks

    def resolve(self, callback: Any, result: TensorDictBase) -> None:
        loop, out, request = callback
        loop.call_soon_threadsafe(_answer, out, {"id": request, "ok": True, "td": to_serialize(result)})

    def resolve_exception(self, callback: Any, exc: BaseException) -> None:
        loop, out, request = callback
        loop.call_soon_threadsafe(
            _answer, out, {"id": request, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        )


def _answer(out: Sender, message: dict) -> None:
    try:
        out.send(message)
    except OSError:
        pass  # the client is gone: so is the collector that asked


def install(worker: Any) -> None:
    """Makes ``worker`` accept inference channels for the servers in :data:`SERVING` (idempotent)."""

    async def daskcollect_infer(comm: Any, server: str) -> Any:
        transport = SERVING.get(server)
        out = Sender(comm)
        if transport is None:
            out.abort()
            return Status.dont_reply
        loop = asyncio.get_running_loop()
        try:
            while True:
                for request in await comm.read():
                    transport.put(request["td"], (loop, out, request["id"]))
        except OSError:  # the collector closed its channel, or is gone
            pass
        finally:
            out.abort()
        return Status.dont_reply

    _internals.add_handlers(worker, {OPEN: daskcollect_infer})


class DaskInferenceClient:
    """A collector's end: picklable; connects, from the worker it runs in, on its first request.

    Args:
        address: The inference server's worker.
        server: The server's name on that worker.
        timeout: Bound, in seconds, on connecting and on each answer.
    """

    def __init__(self, address: str, server: str, timeout: float):
        self.address, self.server, self.timeout = address, server, timeout
        self._channel: _Channel | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"address": self.address, "server": self.server, "timeout": self.timeout}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def submit(self, td: TensorDictBase) -> Future:
        """Sends one request; the future resolves to the server's answer."""
        with self._lock:
            if self._channel is None or self._channel.closed:
                self._channel = _Channel(get_worker(), self.address, self.server, self.timeout)
        return self._channel.submit(td)

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return self.submit(td).result(timeout=self.timeout)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class _Channel:
    """One comm from a collector's worker to an inference server, with its requests in flight."""

    def __init__(self, worker: Any, address: str, server: str, timeout: float):
        self.loop = worker.loop
        self.closed = False
        self._pending: dict[int, tuple[Future, float]] = {}
        self._ids = itertools.count()
        self.latencies = LATENCIES.setdefault(server, deque(maxlen=4096))
        self._out: Sender | None = None
        args = worker.connection_args
        _internals.sync(self.loop, self._open, address, server, args, timeout, callback_timeout=timeout + 5)

    async def _open(self, address: str, server: str, args: dict, timeout: float) -> None:
        try:
            comm = await connect(address, timeout=timeout, name="daskcollect-infer", **args)
            await comm.write({"op": OPEN, "server": server, "reply": False})
        except (OSError, asyncio.TimeoutError) as exc:
            self.closed = True
            raise InferenceServerLostError(
                f"No channel to the inference server on {address} ({exc}).", address=address
            ) from None
        self._out = Sender(comm)
        self._reader = asyncio.ensure_future(self._read(comm, address))

    def submit(self, td: TensorDictBase) -> Future:
        future: Future = Future()
        if self.closed:
            future.set_exception(InferenceServerLostError("The inference server's channel is closed."))
            return future
        request = next(self._ids)
        self._pending[request] = (future, time.perf_counter())
        self.loop.add_callback(self._send, {"id": request, "td": to_serialize(td)})
        return future

    def _send(self, message: dict) -> None:
        try:
            self._out.send(message)
        except OSError as exc:
            self._fail(f"its channel closed ({exc})")

    async def _read(self, comm: Any, address: str) -> None:
        cause = "its channel closed"
        try:
            while True:
                for answer in await comm.read():
                    future, sent = self._pending.pop(answer["id"], (None, 0.0))
                    if future is None:
                        continue
                    self.latencies.append(time.perf_counter() - sent)
                    if answer["ok"]:
                        future.set_result(answer["td"])
                    else:
                        future.set_exception(
                            RuntimeError(f"inference on {address} failed: {answer['error']}")
                        )
        except OSError as exc:
            cause = f"its channel closed ({exc})"
        except asyncio.CancelledError:
            return
        self._fail(f"the inference server on {address} is lost: {cause}")

    def _fail(self, cause: str) -> None:
        self.closed = True
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(InferenceServerLostError(cause))

    def close(self) -> None:
        self.closed = True
        if self._out is not None:
            self.loop.add_callback(self._out.abort)
