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
:class:`~daskcollect.streams.worker.Sender` coalesces the answers that finish
while one is being written.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from typing import Any

import torch
from distributed import get_worker
from distributed.comm import connect
from tensordict import TensorDict, TensorDictBase
from torchrl.modules.inference_server import InferenceTransport

from daskcollect import _internals
from daskcollect.errors import InferenceServerLostError
from daskcollect.streams.worker import Sender

logger = logging.getLogger(__name__)

#: The worker request that turns a fresh comm into an inference channel.
OPEN = "daskcollect_infer"
#: The transports served in this worker process, by server name.
SERVING: dict[str, ServerTransport] = {}
#: Seconds from request to answer of this process's recent requests (the last 4096), per server name, for
#: the last :data:`KEPT_SERVERS` servers asked: a replaced server's name gives way to the newest.
LATENCIES: OrderedDict[str, deque] = OrderedDict()
KEPT_SERVERS = 8


def latencies_of(server: str) -> deque:
    """The recent latencies of ``server`` (kept among the last :data:`KEPT_SERVERS` servers)."""
    kept = LATENCIES.setdefault(server, deque(maxlen=4096))
    LATENCIES.move_to_end(server)
    while len(LATENCIES) > KEPT_SERVERS:
        LATENCIES.popitem(last=False)
    return kept


def latencies(dask_worker: Any = None) -> dict[str, list[float]]:
    """This process's recent action latencies, per server (``Client.run`` it on the collectors' workers)."""
    return {name: list(values) for name, values in LATENCIES.items()}


class ServerTransport(InferenceTransport):
    """The server's end: requests queued by the worker's event loop, drained by TorchRL's server thread."""

    _clients_require_registration = False

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._peeked: tuple | None = None
        #: The open channels' answer streams (closed with the server).
        self.channels: set[Sender] = set()
        #: Seconds from request to answer, as the collectors measured them (the last 4096).
        self.latencies: deque[float] = deque(maxlen=4096)

    def put(self, packed: list[Packed], callback: Any, latency: float | None = None) -> None:
        """Queues one request (event loop): its packed inputs, and ``callback``, ``(loop, sender, request
        id, input keys, output keys)``; ``latency`` is the sender's previous request's."""
        self._queue.put((packed, callback, time.monotonic()))
        if latency is not None:
            self.latencies.append(latency)

    def close(self) -> None:
        """Closes every channel (event loop), so that no comm outlives the server."""
        for out in list(self.channels):
            out.abort()

    def stats(self) -> dict[str, Any]:
        """Requests waiting for a batch, and the action latency's p50 and p99 in milliseconds."""
        latencies = sorted(self.latencies)

        def quantile(q: float) -> float | None:
            return 1e3 * latencies[min(int(q * len(latencies)), len(latencies) - 1)] if latencies else None

        depth = self._queue.qsize() + (self._peeked is not None)
        return {"queue_depth": depth, "p50_action_ms": quantile(0.50), "p99_action_ms": quantile(0.99)}

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
            return _internals.DONT_REPLY
        loop = asyncio.get_running_loop()
        transport.channels.add(out)
        try:
            while True:
                for request in await comm.read():
                    transport.put(request["t"], (loop, out, request["id"], inputs, outputs), request["l"])
        except OSError:  # the collector closed its channel, or is gone
            pass
        finally:
            transport.channels.discard(out)
            out.abort()
        return _internals.DONT_REPLY

    _internals.add_handlers(worker, {OPEN: daskcollect_infer})


class DaskInferenceClient:
    """A collector's end: picklable; connects, from the worker it runs in, on its first request.

    Requests wait in the client until a channel to the server of its ``slot``
    is open. When that server is lost, the requests in flight go back to the
    front of the queue and are sent again, in order, to its replacement, which
    the driver announces in the Dask ``Variable`` ``group``: a forward pass
    changes nothing on the server, so a request answered twice (or by the lost
    server and its replacement) still steps the env once, and the collector's
    frames are neither lost nor duplicated. A request not answered within
    ``timeout`` seconds fails with :class:`InferenceServerLostError`.

    Args:
        group: The Dask ``Variable`` that holds the servers' current routes.
        slot: Which of the routes serves this client (modulo their number).
        routes: The servers' ``(address, name)`` when the collector was built.
        timeout: Bound, in seconds, on connecting and on each answer.
        inputs: The keys a request carries: the policy's in_keys (and
            TorchRL's interaction-type stamp).
        outputs: The keys an answer carries: the policy's out_keys (and the
            policy version, where the server writes it).
    """

    _STATE = ("group", "slot", "routes", "timeout", "inputs", "outputs")

    def __init__(self, group: str, slot: int, routes: list, timeout: float, inputs: list, outputs: list):
        self.group, self.slot, self.timeout = group, slot, timeout
        self.routes = [tuple(route) for route in routes]
        self.inputs, self.outputs = list(inputs), list(outputs)
        self._worker: Any = None
        self._channel: _Channel | None = None
        self._connecting: asyncio.Future | None = None
        self._waiting: deque[_Request] = deque()
        self._dead: set[tuple] = set()
        self._cause = ""

    def __getstate__(self) -> dict:
        return {key: getattr(self, key) for key in self._STATE}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def submit(self, td: TensorDictBase) -> Future:
        """Sends one request; the future resolves to the server's answer."""
        request = _Request(td, pack(td, self.inputs))
        if self._worker is None:
            self._worker = get_worker()
        self._worker.loop.add_callback(self._dispatch, request)
        return request.future

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return self.submit(td).result(timeout=self.timeout + 1)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.loop.add_callback(self._close)

    # Everything below runs on the worker's event loop.

    def _dispatch(self, request: _Request) -> None:
        request.timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, request)
        self._waiting.append(request)
        self._flush()

    def _flush(self) -> None:
        while self._waiting:
            channel = self._channel
            if channel is None:
                if self._connecting is None:
                    self._connecting = asyncio.ensure_future(self._connect())
                return
            request = self._waiting.popleft()
            if not request.future.done():
                channel.send(request)  # on failure, the channel gives it back (lost)

    async def _connect(self) -> None:
        try:
            while self._live():
                route = await self._route()
                if route is None:
                    return
                try:
                    self._channel = await _Channel.open(self, route, self._worker.connection_args)
                    break
                except (OSError, asyncio.TimeoutError) as exc:
                    self._lose(route, f"no channel to it ({exc})")
        finally:
            self._connecting = None
        self._flush()

    async def _route(self) -> tuple | None:
        """This client's server, once one is not known lost; ``None`` when no request waits for it."""
        while self._live():
            route = self.routes[self.slot % len(self.routes)]
            if route not in self._dead:
                return route
            try:
                current = await _internals.read_variable(self._worker, self.group, timeout=ROUTE_POLL)
            except OSError:  # the scheduler is out of reach: try again while requests wait
                current = None
            if current is not None and current["failed"]:
                self._fail_waiting(current["failed"])
                return None
            if current is not None:
                self.routes = [tuple(r) for r in current["routes"]]
                self._dead &= set(self.routes)  # a replaced server's route is never listed again
            if self.routes[self.slot % len(self.routes)] in self._dead:
                await asyncio.sleep(ROUTE_POLL)
        return None

    def _live(self) -> bool:
        return any(not request.future.done() for request in self._waiting)

    def _lose(self, route: tuple, cause: str) -> None:
        self._dead.add(route)
        self._cause = f"the inference server {route[1]} on {route[0]} is lost: {cause}"
        # A server closed with its collection ends idle channels: only a loss with requests is news.
        log = logger.warning if self._live() else logger.debug
        log("%s; requests wait for its replacement", self._cause)

    def lost(self, channel: _Channel, cause: str) -> None:
        """``channel`` closed: its requests in flight wait, first, for the server's replacement."""
        if self._channel is channel:
            self._channel = None
        self._waiting.extendleft(reversed(channel.take()))
        self._lose(channel.route, cause)
        self._flush()

    def _fail_waiting(self, cause: str) -> None:
        while self._waiting:
            request = self._waiting.popleft()
            if not request.future.done():
                request.future.set_exception(InferenceServerLostError(f"{cause[:1].upper()}{cause[1:]}."))

    def _expire(self, request: _Request) -> None:
        if not request.future.done():
            cause = self._cause or "it did not answer"
            request.future.set_exception(
                InferenceServerLostError(f"No answer within {self.timeout:g}s: {cause}.")
            )
        if self._channel is not None:
            self._channel.forget(request)

    def _close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        if self._channel is not None:
            self._channel.close()
            self._channel = None


#: Seconds between a client's looks at the servers' routes while its server is lost.
ROUTE_POLL = 0.25


class _Request:
    """One request: the TensorDict the answer is written into, its packed inputs and its future."""

    __slots__ = ("td", "packed", "future", "sent", "timer", "id")

    def __init__(self, td: TensorDictBase, packed: list[Packed]):
        self.td, self.packed, self.future = td, packed, Future()
        self.sent, self.timer, self.id = 0.0, None, -1

    def resolve(self, answer: dict, outputs: list, address: str) -> float | None:
        """Resolves the future with ``answer``; returns the seconds since it was sent, or ``None`` if it
        was resolved before (expired)."""
        if self.timer is not None:
            self.timer.cancel()
        if self.future.done():
            return None
        if answer["ok"]:
            # As a local TensorDictModule does: the outputs are written into the request.
            self.future.set_result(self.td.update(unpack(answer["t"], outputs)))
        else:
            self.future.set_exception(RuntimeError(f"inference on {address} failed: {answer['error']}"))
        return time.perf_counter() - self.sent


class _Channel:
    """One comm from a collector's worker to an inference server, with its requests in flight."""

    def __init__(self, client: DaskInferenceClient, route: tuple, comm: Any):
        self.client, self.route, self.closed = client, route, False
        self._pending: dict[int, _Request] = {}
        self._ids = itertools.count()
        self._out = Sender(comm)
        self.latencies = latencies_of(route[1])
        self.last: float | None = None  # the latest answer's latency, reported to the server with the next
        self._reader = asyncio.ensure_future(self._read(comm))

    @classmethod
    async def open(cls, client: DaskInferenceClient, route: tuple, args: dict) -> _Channel:
        address, server = route
        hello = _internals.rpc_message(OPEN, server=server, inputs=client.inputs, outputs=client.outputs)
        comm = await connect(address, timeout=client.timeout, name="daskcollect-infer", **args)
        await comm.write(hello)
        return cls(client, route, comm)

    def send(self, request: _Request) -> None:
        request.id, request.sent = next(self._ids), time.perf_counter()
        self._pending[request.id] = request
        try:
            self._out.send({"id": request.id, "t": request.packed, "l": self.last})
        except OSError as exc:
            self._end(f"its channel closed ({exc})")

    def take(self) -> list[_Request]:
        """The requests in flight, in the order they were sent, no longer this channel's."""
        pending, self._pending = self._pending, {}
        return [request for _, request in sorted(pending.items()) if not request.future.done()]

    def forget(self, request: _Request) -> None:
        self._pending.pop(request.id, None)

    async def _read(self, comm: Any) -> None:
        cause, outputs, address = "its channel closed", self.client.outputs, self.route[0]
        try:
            while True:
                for answer in await comm.read():
                    request = self._pending.pop(answer["id"], None)
                    took = None if request is None else request.resolve(answer, outputs, address)
                    if took is not None:
                        self.latencies.append(took)
                        self.last = took
        except OSError as exc:
            cause = f"its channel closed ({exc})"
        except asyncio.CancelledError:
            return
        self._end(cause)

    def _end(self, cause: str) -> None:
        if not self.closed:
            self.closed = True
            self._out.abort()
            self.client.lost(self, cause)

    def close(self) -> None:
        self.closed = True
        self._reader.cancel()
        self._out.abort()
