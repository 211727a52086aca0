"""The driver's end of the completion streams: one Dask comm per collector, on every host.

Rollout requests go out and finished rollouts come back over a comm that the
driver opens to the collector's worker with ``distributed.comm.connect`` and
the client's connection arguments: TCP, TLS or any Dask comm backend, with the
cluster's security, whatever host the worker is on. The worker's end is
:mod:`daskcollect.streams.worker`.

- :meth:`CompletionStreams.request` (any thread) queues one request, carrying a
  weights reference; one event-loop callback hands every request queued by then
  to its stream's :class:`~daskcollect.streams.worker.Sender`.
- The reader of each stream, on the event loop, takes every answer that arrived
  in one read and hands each to ``on_answer(uid, (ok, value))``, in the order
  the requests were sent. A stream that closes (its worker died, or the link)
  is handed over as ``on_answer(uid, None, cause)``: the collector is lost.
- A collector on the driver's host (``here`` at :meth:`CompletionStreams.open`) sends its answers,
  and takes its requests, over a same-host channel (:mod:`daskcollect.streams.local`) whose
  thread hands them to ``on_answer`` off the event loop; its stream stays open for its liveness
  and for requests whose weights only Dask can carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from distributed import Client
from distributed.comm import connect
from distributed.protocol import to_serialize

from daskcollect import _internals
from daskcollect.streams import local
from daskcollect.streams.worker import OPEN, Sender
from daskcollect.weights.shm import SharedMemoryRef

logger = logging.getLogger(__name__)

#: ``on_answer(uid, outcome, cause)``: ``outcome`` is ``(ok, rollout or exception)``, or ``None``
#: when the stream closed (``cause`` says why).
OnAnswer = Callable[[int, "tuple[bool, Any] | None", str], None]


class CompletionStreams:
    """The completion streams of one collection.

    Args:
        client: The collection's client (its event loop runs the streams).
        on_answer: Called on the event loop for each answer, and once when a
            stream closes.
        timeout: Bound, in seconds, on opening a stream.
        same_host: Whether collectors on the driver's host answer over same-host channels.
    """

    def __init__(self, client: Client, on_answer: OnAnswer, timeout: float, same_host: bool = True):
        self.client, self._on_answer, self.timeout = client, on_answer, timeout
        self._same_host = same_host and local.available()
        self._inbox: local.Inbox | None = None
        self._senders: dict[int, Sender] = {}
        # Requests from other threads wait here; one event-loop callback sends all that queued.
        self._requests: list[tuple[int, dict]] = []
        self._requests_lock = threading.Lock()
        self._readers: dict[int, asyncio.Task] = {}
        self._closed = False

    def sizes(self) -> dict[str, int]:
        """How many collectors' streams are open (a bound check for tests)."""
        inbox = self._inbox.sizes() if self._inbox is not None else {}
        return {"senders": len(self._senders), "readers": len(self._readers), **inbox}

    def same_host(self, uid: int) -> bool:
        """Whether collector ``uid`` answers over a same-host channel."""
        return self._inbox is not None and self._inbox.has(uid)

    # --- opening ---------------------------------------------------------------
    def open(self, streams: list[tuple[int, str, str, bool]]) -> list[int]:
        """Opens a stream per ``(uid, worker address, actor key, here)`` (bounded), and a same-host
        channel for those ``here``, on the driver's host; returns the uids whose worker could not
        be reached (their first request reports the collector lost)."""
        if not streams:
            return []
        if self._inbox is None and self._same_host and not self._closed and any(s[3] for s in streams):
            try:
                self._inbox = local.Inbox(self._on_answer)
            except OSError as exc:  # e.g. a sandbox without Unix sockets: the Dask streams carry all
                logger.warning("no same-host channels (%s); every rollout takes its Dask stream", exc)
                self._same_host = False
        return _internals.sync(
            self.client.loop, self._open_all, streams, callback_timeout=2 * self.timeout + 5
        )

    async def _open_all(self, streams: list[tuple[int, str, str, bool]]) -> list[int]:
        opened = await asyncio.gather(*(self._open(*s) for s in streams))
        return [uid for (uid, *_), ok in zip(streams, opened) if not ok]

    async def _open(self, uid: int, address: str, key: str, here: bool) -> bool:
        inbox = self._inbox if here else None
        offer, joined = inbox.offer(uid) if inbox is not None else (None, None)
        extra = {"same_host": offer} if offer is not None else {}
        try:
            comm = await connect(
                address, timeout=self.timeout, name="daskcollect-stream", **self.client.connection_args
            )
            await comm.write(_internals.rpc_message(OPEN, actor=key, **extra))
            if inbox is not None:
                reply = await asyncio.wait_for(comm.read(), self.timeout)
                if reply.get("same_host"):
                    await asyncio.wait_for(asyncio.wrap_future(joined), self.timeout)
                else:
                    inbox.withdraw(uid)
        except (OSError, asyncio.TimeoutError) as exc:
            logger.info("collector %d: no stream to %s (%s)", uid, address, exc)
            if inbox is not None:
                inbox.withdraw(uid)
                inbox.drop(uid)
            return False
        if self._closed:
            comm.abort()
            return False
        self._senders[uid] = Sender(comm)
        self._readers[uid] = asyncio.ensure_future(self._read(uid, comm))
        return True

    # --- requests and answers --------------------------------------------------
    def request(self, uid: int, weights: Any) -> None:
        """Queues one rollout request on collector ``uid``'s stream (from any thread); on its same-host
        channel, it is written there at once."""
        if (weights is None or isinstance(weights, SharedMemoryRef)) and self.same_host(uid):
            try:
                self._inbox.request(uid, weights)
            except OSError as exc:
                self._on_answer(uid, None, f"its same-host channel closed ({exc})")
            return
        message = {"weights": None if weights is None else to_serialize(weights)}
        with self._requests_lock:
            self._requests.append((uid, message))
            wake = len(self._requests) == 1
        if wake:
            self.client.loop.add_callback(self._send)

    def _send(self) -> None:
        with self._requests_lock:
            requests, self._requests = self._requests, []
        for uid, message in requests:
            out = self._senders.get(uid)
            try:
                if out is None:
                    raise OSError("no stream to its worker")
                out.send(message)
            except OSError as exc:
                self._on_answer(uid, None, f"its stream closed ({exc})")

    async def _read(self, uid: int, comm: Any) -> None:
        cause = "its stream closed"
        try:
            while True:
                for answer in await comm.read():
                    if answer.get("status") == "OK":
                        self._on_answer(uid, (True, answer["result"]), "")
                    else:
                        self._on_answer(uid, (False, answer["exception"]), "")
        except OSError as exc:
            cause = f"its stream closed ({exc})"
        except asyncio.CancelledError:
            return
        except Exception as exc:  # an answer that did not deserialize: the stream cannot go on
            logger.warning("collector %d: unreadable answer (%s: %s)", uid, type(exc).__name__, exc)
            cause = f"its answer could not be read ({type(exc).__name__}: {exc})"
            comm.abort()
        self._senders.pop(uid, None)
        self._on_answer(uid, None, cause)

    # --- closing ---------------------------------------------------------------
    def drop(self, uid: int) -> None:
        """Closes collector ``uid``'s stream (from any thread); its worker stops after the rollout
        it is running."""
        with contextlib.suppress(RuntimeError):  # the loop is gone: so is the stream
            self.client.loop.add_callback(self._drop, uid)

    def _drop(self, uid: int) -> None:
        if self._inbox is not None:
            self._inbox.drop(uid)
        reader, out = self._readers.pop(uid, None), self._senders.pop(uid, None)
        if reader is not None:
            reader.cancel()
        if out is not None:
            out.abort()

    def close(self, timeout: float) -> None:
        """Closes every stream (bounded, idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # a client whose loop stopped has no streams left
            _internals.sync(self.client.loop, self._close_all, callback_timeout=timeout)
        if self._inbox is not None:
            self._inbox.close(timeout)

    async def _close_all(self) -> None:
        for uid in list(self._readers):
            self._drop(uid)
