"""The worker's end of a completion stream: rollout requests in, finished rollouts out, over one Dask comm.

The driver opens one comm per collector to the collector's worker, through
Dask's comm layer (so TCP, TLS or any Dask comm backend, with the cluster's
security), and sends ``{"op": "daskcollect_stream", "actor": key}``; the
worker's server hands the comm to :func:`install`'s handler, which keeps it
for the collector's life:

- Each message from the driver, ``{"weights": ref}``, is one rollout request,
  carrying the weights reference to load first (or ``None``): a credit. The driver keeps up to its
  async depth of them queued, so the collector runs rollout after rollout
  without waiting for the next request.
- Each rollout runs through Dask's own actor runner
  (:func:`daskcollect._internals.run_actor_method`), in the actor's thread, with the
  worker context that ``distributed.get_worker()`` reads, one at a time and in
  order. The rollout is serialized there too (:func:`serialized`).
- Each answer (Dask's ``{"status": ..., "result" | "exception": ...}``) is pushed
  as soon as it exists (:class:`Sender`); answers that finish while one is being
  written leave together in the next write.

A comm that closes (the driver dropped the collector, closed, or died) ends the
handler: the rollout running then finishes, and nothing more starts.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import pickle
import secrets
import socket
from collections.abc import Callable
from typing import Any

import dask
from distributed.comm import CommClosedError
from distributed.protocol import to_serialize

from daskcollect import _internals
from daskcollect.streams import local

logger = logging.getLogger(__name__)

#: The worker request that turns a fresh comm into a completion stream.
OPEN = "daskcollect_stream"

#: The streams this worker serves now: actor key -> the comm's local address (its scheme says the
#: transport, ``tls://`` on a TLS cluster).
serving: dict[str, str] = {}


class QueuedWriter:
    """Writes queued items in order from one task at a time, each round taking every item queued
    since the last; a write that fails aborts (event-loop only). Subclasses say how a round is
    written (:meth:`_write_all`) and how to close (:meth:`abort`)."""

    def __init__(self) -> None:
        self._buffer: list[Any] = []
        self._writing: asyncio.Task | None = None

    def _enqueue(self, item: Any) -> None:
        self._buffer.append(item)
        if self._writing is None:
            self._writing = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            while self._buffer:
                items, self._buffer = self._buffer, []
                await self._write_all(items)
        except OSError:
            self.abort()  # the reading end sees it closed and reports it
        finally:
            self._writing = None

    async def _write_all(self, items: list[Any]) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class Sender(QueuedWriter):
    """Writes messages on a comm in order, each write taking every message queued since the last.

    What ``BatchedSend`` does for workers' messages to the scheduler, without its interval: a
    completion leaves as soon as it exists, and answers that finish while one is being written
    leave together in the next write. No timer per message (``BatchedSend`` sets one for each wait),
    and no log of recent messages (it would keep the last rollouts' batches alive). Event-loop
    only.

    Args:
        comm: The comm, connected; :meth:`abort` closes it.
    """

    def __init__(self, comm: Any):
        super().__init__()
        self.comm = comm

    def send(self, message: Any) -> None:
        """Queues ``message``.

        Raises:
            CommClosedError: If the comm is closed (an ``OSError``).
        """
        if self.comm.closed():
            raise CommClosedError(f"{self.comm!r} is closed")
        self._enqueue(message)

    async def _write_all(self, items: list[Any]) -> None:
        await self.comm.write(items)

    def abort(self) -> None:
        """Drops what is queued and closes the comm at once (idempotent)."""
        self._buffer = []
        if not self.comm.closed():
            self.comm.abort()


def serialized(value: Any) -> Any:
    """``value`` as Dask's wire form, for a completion stream to send as it is.

    Done in the actor's thread, this takes the serialization off the worker's
    event loop, and Dask writes a ``Serialized`` without its per-frame
    compression pass, which on a rollout's dozen small frames cost as much as
    the serialization itself (about 100 us of 200 per answer, measured). Dask
    compresses nothing by default (``distributed.comm.compression``); where a
    user turns it on, the frames are compressed here as Dask would. The
    driver's comm deserializes it as any other message.
    """
    return _internals.serialized(value, dask.config.get("distributed.comm.compression", False) or None)


def install(worker: Any) -> None:
    """Makes ``worker`` serve completion streams (idempotent).

    The handler is a closure over ``worker``: Dask's server wants named
    functions (no ``functools.partial``).
    """

    async def daskcollect_stream(comm: Any, actor: str, same_host: dict | None = None) -> Any:
        requests: asyncio.Queue = asyncio.Queue()
        channel = None
        if same_host is not None:
            channel = await SameHostChannel.connect(same_host)
            await comm.write({"same_host": channel is not None})
        out = Sender(comm)
        # Names this stream's schema on the driver (streams.packing): a new stream gets it again.
        token = secrets.randbits(63)
        if channel is not None:
            method, extra, deliver = "rollout_frames", (channel.ring,), channel.deliver
            reader = asyncio.ensure_future(channel.read_requests(requests, comm.abort))
        else:
            method, extra, reader = "rollout_serialized", (), None

            def deliver(answer: dict) -> None:
                out.send(_internals.unwrap_actor_result(answer))

        runner = asyncio.ensure_future(_run(worker, actor, requests, deliver, method, token, *extra))
        serving[actor] = "same-host" if channel is not None else comm.local_address
        try:
            while not runner.done():
                for request in await comm.read():
                    requests.put_nowait(request["weights"])
        except OSError:  # the driver closed the stream, or is gone
            pass
        finally:
            serving.pop(actor, None)
            for task in (runner, reader):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            out.abort()
            if channel is not None:
                channel.abort()
        return _internals.DONT_REPLY

    _internals.add_handlers(worker, {OPEN: daskcollect_stream})


async def _run(
    worker: Any, actor: str, requests: asyncio.Queue, deliver: Callable, method: str, token: int, *extra: Any
) -> None:
    """Runs the queued rollout requests one after the other and delivers each answer."""
    while True:
        weights = await requests.get()
        try:
            answer = await _internals.run_actor_method(worker, actor, method, weights, token, *extra)
        except KeyError:  # the actor was released: the driver has dropped this collector
            return
        except Exception as exc:  # raised outside the rollout (Dask's runner): still an answer
            answer = {"status": "error", "exception": to_serialize(exc)}
        try:
            deliver(answer)
        except OSError:
            return


class SameHostChannel(QueuedWriter):
    """The worker's end of a same-host channel (:mod:`daskcollect.streams.local`). Event-loop only.

    Args:
        sock: The connected socket, non-blocking.
    """

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.ring = local.SlotRing()  # where the actor's thread puts large buffers (local.encode)
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def connect(cls, offer: dict) -> SameHostChannel | None:
        """Connects to the driver's inbox and says which collector this is; ``None`` if it cannot."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_connect(sock, offer["name"]), timeout=5)
            hello = local.encode({"token": offer["token"], "uid": offer["uid"]})
            await loop.sock_sendall(sock, hello.parts[0])
        except (OSError, asyncio.TimeoutError) as exc:
            logger.info("no same-host channel to the driver (%s); answers take the Dask stream", exc)
            sock.close()
            return None
        return cls(sock)

    async def read_requests(self, requests: asyncio.Queue, on_close: Callable[[], None]) -> None:
        """Queues each request read until the driver closes the channel; then calls ``on_close``
        (which closes the collector's Dask stream, ending it)."""
        pending = bytearray()
        size = local.REQUEST.size
        try:
            while True:
                data = await self._loop.sock_recv(self.sock, 65536)
                if not data:
                    break
                pending += data
                while len(pending) >= size:
                    (length,) = local.REQUEST.unpack_from(pending)
                    if len(pending) < size + length:
                        break
                    request = pickle.loads(pending[size : size + length])
                    del pending[: size + length]
                    if isinstance(request, local.Release):
                        self.ring.release(request.slot)
                    else:
                        requests.put_nowait(request)
        except OSError:
            pass
        on_close()

    def deliver(self, answer: dict) -> None:
        """Sends an answer of Dask's actor runner: a rollout encoded in the actor's thread
        (``rollout_frames``), or an exception, encoded here."""
        ok, value = _internals.actor_answer(answer)
        if not ok:
            try:
                value = local.encode({"status": "error", "exception": value})
            except Exception as exc:  # an exception that does not pickle: its text still reaches the driver
                value = local.encode(
                    {"status": "error", "exception": RuntimeError(f"{type(value).__name__}: {value}")}
                )
                logger.debug("an unpicklable exception sent as text (%s)", exc)
        self._enqueue(value)

    async def _write_all(self, items: list[local.Message]) -> None:
        for message in items:
            await self._send(message)

    async def _send(self, message: local.Message) -> None:
        """All of ``message``: one ``sendmsg`` for what the socket takes at once (with the descriptors
        of new slots, which go with its first byte), then the rest."""
        parts = message.parts
        fds = array.array("i", message.fds)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)] if message.fds else []
        while True:
            try:
                sent = self.sock.sendmsg(parts, ancillary)
                break
            except (BlockingIOError, InterruptedError):
                if not ancillary:
                    sent = 0
                    break
                await self._writable()
        for part in parts:
            view = memoryview(part).cast("B")
            if sent >= view.nbytes:
                sent -= view.nbytes
                continue
            await self._loop.sock_sendall(self.sock, view[sent:])
            sent = 0

    async def _writable(self) -> None:
        ready = self._loop.create_future()
        self._loop.add_writer(self.sock, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            self._loop.remove_writer(self.sock)

    def abort(self) -> None:
        """Closes the channel and its slots (idempotent); what is queued is dropped."""
        self._buffer = []
        self.sock.close()
        self.ring.close()
