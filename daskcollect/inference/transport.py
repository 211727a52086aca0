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

A request carries only the policy's input tensors, and an answer only its
output tensors, as raw bytes in the message (:func:`pack`): msgpack writes
bytes as they are, where a TensorDict would go through Dask's serialization
machinery, which cost more CPU per step than the env and the transfer
together (py-spy, benchmarks/central_inference.py). The keys travel once, when
the channel opens.

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

import torch
from distributed import get_worker
from distributed.comm import connect
from distributed.core import Status
from tensordict import TensorDict, TensorDictBase
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

    def put(self, packed: list[Packed], callback: Any) -> None:
        """Queues one request (event loop): its packed inputs, and ``callback``, ``(loop, sender, request
        id, input keys, output keys)``."""
        self._queue.put((packed, callback, time.monotonic()))

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
        items = [TensorDict(unpack(packed, callback[3]), batch_size=[]) for packed, callback, _ in taken]
        return items, [t[1] for t in taken], [t[2] for t in taken]

    def drain(self, max_items: int) -> tuple[list, list]:
        items, callbacks, _ = self.drain_with_timing(max_items)
        return items, callbacks

    def resolve(self, callback: Any, result: TensorDictBase) -> None:
        loop, out, request, _, keys = callback
        answer = {"id": request, "ok": True, "t": pack(result, keys)}
        loop.call_soon_threadsafe(_answer, out, answer)

    def resolve_exception(self, callback: Any, exc: BaseException) -> None:
        loop, out, request = callback[:3]
        loop.call_soon_threadsafe(
            _answer, out, {"id": request, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        )


#: One tensor on the wire: its bytes, dtype name and shape (msgpack-able).
Packed = tuple[bytes, str, tuple[int, ...]]


def pack(td: TensorDictBase, keys: list) -> list[Packed]:
    """The tensors of ``td`` at ``keys``, as bytes with their dtype and shape (CPU)."""
    out = []
    for key in keys:
        tensor = td.get(key).detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        out.append((tensor.contiguous().numpy().tobytes(), str(tensor.dtype)[6:], tuple(tensor.shape)))
    return out


def unpack(packed: list[Packed], keys: list) -> dict:
    """The inverse of :func:`pack`: ``{key: tensor}`` over the received bytes (copied once)."""
    return {
        key: torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)
        for key, (data, dtype, shape) in zip(keys, packed)
    }


def nested(keys: list) -> list:
    """Keys as msgpack returns them (tuples become lists) back to TensorDict keys."""
    return [tuple(k) if isinstance(k, list) else k for k in keys]


def _answer(out: Sender, message: dict) -> None:
    try:
        out.send(message)
    except OSError:
        pass  # the client is gone: so is the collector that asked


def install(worker: Any) -> None:
    """Makes ``worker`` accept inference channels for the servers in :data:`SERVING` (idempotent)."""

    async def daskcollect_infer(comm: Any, server: str, inputs: list, outputs: list) -> Any:
        transport = SERVING.get(server)
        inputs, outputs = nested(inputs), nested(outputs)
        out = Sender(comm)
        if transport is None:
            out.abort()
            return Status.dont_reply
        loop = asyncio.get_running_loop()
        try:
            while True:
                for request in await comm.read():
                    transport.put(request["t"], (loop, out, request["id"], inputs, outputs))
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
        inputs: The keys a request carries: the policy's in_keys (and
            TorchRL's interaction-type stamp).
        outputs: The keys an answer carries: the policy's out_keys (and the
            policy version, where the server writes it).
    """

    def __init__(self, address: str, server: str, timeout: float, inputs: list, outputs: list):
        self.address, self.server, self.timeout = address, server, timeout
        self.inputs, self.outputs = list(inputs), list(outputs)
        self._channel: _Channel | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {key: getattr(self, key) for key in ("address", "server", "timeout", "inputs", "outputs")}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def submit(self, td: TensorDictBase) -> Future:
        """Sends one request; the future resolves to the server's answer."""
        with self._lock:
            if self._channel is None or self._channel.closed:
                self._channel = _Channel(get_worker(), self)
        return self._channel.submit(td)

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return self.submit(td).result(timeout=self.timeout)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class _Channel:
    """One comm from a collector's worker to an inference server, with its requests in flight."""

    def __init__(self, worker: Any, client: DaskInferenceClient):
        self.loop = worker.loop
        self.closed = False
        self.inputs, self.outputs = client.inputs, client.outputs
        self._pending: dict[int, tuple[Future, TensorDictBase, float]] = {}
        self._ids = itertools.count()
        self.latencies = LATENCIES.setdefault(client.server, deque(maxlen=4096))
        self._out: Sender | None = None
        args, timeout = worker.connection_args, client.timeout
        _internals.sync(self.loop, self._open, client, args, callback_timeout=timeout + 5)

    async def _open(self, client: DaskInferenceClient, args: dict) -> None:
        address = client.address
        hello = {
            "op": OPEN,
            "server": client.server,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "reply": False,
        }
        try:
            comm = await connect(address, timeout=client.timeout, name="daskcollect-infer", **args)
            await comm.write(hello)
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
        message = {"id": request, "t": pack(td, self.inputs)}
        self._pending[request] = (future, td, time.perf_counter())
        self.loop.add_callback(self._send, message)
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
                    future, td, sent = self._pending.pop(answer["id"], (None, None, 0.0))
                    if future is None:
                        continue
                    self.latencies.append(time.perf_counter() - sent)
                    if answer["ok"]:
                        # As a local TensorDictModule does: the outputs are written into the request.
                        future.set_result(td.update(unpack(answer["t"], self.outputs)))
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
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(InferenceServerLostError(cause))

    def close(self) -> None:
        self.closed = True
        if self._out is not None:
            self.loop.add_callback(self._out.abort)
