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

import asyncio
import contextlib
import logging
import secrets
from typing import Any

import dask
from distributed.comm import CommClosedError
from distributed.protocol import to_serialize

from daskcollect import _internals

logger = logging.getLogger(__name__)

#: The worker request that turns a fresh comm into a completion stream.
OPEN = "daskcollect_stream"

#: The streams this worker serves now: actor key -> the comm's local address (its scheme says the
#: transport, ``tls://`` on a TLS cluster).
serving: dict[str, str] = {}


class Sender:
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
        self.comm = comm
        self._buffer: list[Any] = []
        self._writing: asyncio.Task | None = None

    def send(self, message: Any) -> None:
        """Queues ``message``.

        Raises:
            CommClosedError: If the comm is closed (an ``OSError``).
        """
        if self.comm.closed():
            raise CommClosedError(f"{self.comm!r} is closed")
        self._buffer.append(message)
        if self._writing is None:
            self._writing = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        try:
            while self._buffer:
                payload, self._buffer = self._buffer, []
                await self.comm.write(payload)
        except OSError:
            self.abort()  # the reader of this comm sees it closed and reports it
        finally:
            self._writing = None

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

    async def daskcollect_stream(comm: Any, actor: str) -> Any:
        requests: asyncio.Queue = asyncio.Queue()
        out = Sender(comm)
        # Names this stream's schema on the driver (streams.packing): a new stream gets it again.
        token = secrets.randbits(63)
        runner = asyncio.ensure_future(_run(worker, actor, requests, out, token))
        serving[actor] = comm.local_address
        try:
            while not runner.done():
                for request in await comm.read():
                    requests.put_nowait(request["weights"])
        except OSError:  # the driver closed the stream, or is gone
            pass
        finally:
            serving.pop(actor, None)
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
            out.abort()
        return _internals.DONT_REPLY

    _internals.add_handlers(worker, {OPEN: daskcollect_stream})


async def _run(worker: Any, actor: str, requests: asyncio.Queue, out: Sender, token: int) -> None:
    """Runs the queued rollout requests one after the other and pushes each answer."""
    while True:
        weights = await requests.get()
        try:
            answer = await _internals.run_actor_method(worker, actor, "rollout_serialized", weights, token)
        except KeyError:  # the actor was released: the driver has dropped this collector
            return
        except Exception as exc:  # raised outside the rollout (Dask's runner): still an answer
            answer = {"status": "error", "exception": to_serialize(exc)}
        try:
            out.send(_internals.unwrap_actor_result(answer))
        except OSError:
            return
