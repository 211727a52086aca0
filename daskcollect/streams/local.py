"""Same-host channels: rollouts from collectors on the driver's host, off Dask's event loop.

A collector whose worker shares the driver's host (its shared-memory probe
matched, :mod:`daskcollect.weights.shm`) still opens its Dask completion
stream, which carries its liveness and any request the channel cannot, but
sends its rollouts, and takes its requests, over a Unix socket:

- The driver's :class:`Inbox` listens on one abstract Unix socket (Linux; a
  name, no file to leave behind, reachable only from the driver's network
  namespace, so simulated hosts stay remote). One thread of its own reads
  every channel and hands each answer to ``on_answer`` as the stream's reader
  does: a batch costs the driver one wake of that thread, a few ``recv``
  calls and an unpickling, and no event-loop callback, Tornado read or msgpack
  decoding (the per-message cost that P7 measured on the loop, docs/scale.md).
- Requests go from the thread that makes them straight into the socket.
- A worker proves the channel is its own with a token the driver sent it
  over the (possibly TLS) Dask stream; a channel that cannot connect, such as
  a worker of another user or in another network namespace, leaves the
  collector on its Dask stream.

Messages (:func:`encode`): the answer pickled with protocol 5, its out-of-band
buffers (a packed batch's one buffer, :mod:`daskcollect.streams.packing`)
after it, each read into a buffer of its own that the rebuilt batch views:
no copy past the kernel's. Requests are a length and a pickle.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import pickle
import secrets
import selectors
import socket
import struct
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy

logger = logging.getLogger(__name__)

#: An answer's prefix: its pickle's length and how many out-of-band buffers follow it.
HEAD = struct.Struct("<II")
#: A request's prefix: its pickle's length.
REQUEST = struct.Struct("<I")

#: ``on_answer(uid, outcome, cause)``, as :data:`daskcollect.streams.driver.OnAnswer`.
OnAnswer = Callable[[int, "tuple[bool, Any] | None", str], None]


def available() -> bool:
    """Whether this platform has abstract Unix sockets (Linux)."""
    return sys.platform.startswith("linux")


def encode(answer: Any) -> list[Any]:
    """``answer`` as one message: a header (prefix, buffer lengths, pickle) and its out-of-band buffers."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(answer, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    lengths = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
    return [HEAD.pack(len(data), len(raws)) + lengths + data, *raws]


def encode_request(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=5)
    return REQUEST.pack(len(data)) + data


class Reader:
    """Rebuilds one channel's messages from non-blocking reads, whatever their split.

    Args:
        sock: The connected socket, non-blocking.
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._start()

    def _start(self) -> None:
        self._target = bytearray(HEAD.size)
        self._filled, self._stage = 0, "head"
        self._data: bytearray | None = None
        self._lengths: tuple[int, ...] = ()
        self._buffers: list[Any] = []

    def read(self) -> list[Any]:
        """Every message complete after reading all there is now.

        Raises:
            EOFError: If the peer closed the channel.
        """
        done = []
        while True:
            view = memoryview(self._target)[self._filled :]
            if view.nbytes:
                try:
                    n = self.sock.recv_into(view)
                except (BlockingIOError, InterruptedError):
                    return done
                if n == 0:
                    raise EOFError("the channel closed")
                self._filled += n
                if n < view.nbytes:
                    continue
            message = self._advance()
            if message is not None:
                done.append(message)

    def _advance(self) -> Any:
        """Moves past a filled target; the message when it was the last."""
        if self._stage == "head":
            size, count = HEAD.unpack(self._target)
            self._data, self._stage = bytearray(size), "lengths"
            self._target, self._filled = bytearray(8 * count), 0
            return None
        if self._stage == "lengths":
            self._lengths = struct.unpack(f"<{len(self._target) // 8}Q", self._target)
            self._target, self._filled, self._stage = self._data, 0, "buffers"
            return None
        if self._target is not self._data:
            self._buffers.append(self._target)
        if len(self._buffers) < len(self._lengths):
            # Not zeroed first, as bytearray(n) would be: a pixel batch's tens of MB are written once, by recv.
            self._target, self._filled = numpy.empty(self._lengths[len(self._buffers)], numpy.uint8), 0
            return None
        message = pickle.loads(self._data, buffers=self._buffers)
        self._start()
        return message


class _Channel:
    """The driver's end of one channel: its reader, and a lock for the requests written to it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.reader = sock, Reader(sock)
        self.uid: int | None = None  # known from its hello
        self.lock = threading.Lock()


class Inbox:
    """The driver's end of the same-host channels of one collection.

    Args:
        on_answer: Called, in the inbox's thread, for each answer, and once when a channel closes.
    """

    def __init__(self, on_answer: OnAnswer):
        self._on_answer = on_answer
        self.name = f"\0daskcollect-{os.getpid()}-{secrets.token_hex(8)}"
        self.token = secrets.token_hex(16)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.name)
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._lock = threading.Lock()
        self._channels: dict[int, _Channel] = {}
        self._expected: dict[int, Future] = {}
        self._dropped: list[int] = []
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="daskcollect-same-host", daemon=True)
        self._thread.start()

    def offer(self, uid: int) -> tuple[dict, Future]:
        """What collector ``uid``'s worker needs to connect, and a future set when it has."""
        future: Future = Future()
        with self._lock:
            self._expected[uid] = future
        return {"name": self.name, "token": self.token, "uid": uid}, future

    def withdraw(self, uid: int) -> None:
        """Forgets an offer whose worker stays on its Dask stream."""
        with self._lock:
            self._expected.pop(uid, None)

    def has(self, uid: int) -> bool:
        return uid in self._channels

    def sizes(self) -> dict[str, int]:
        return {"same-host channels": len(self._channels), "same-host offers": len(self._expected)}

    def request(self, uid: int, value: Any) -> None:
        """Writes one request on ``uid``'s channel (any thread).

        Raises:
            OSError: If the channel is closed, or its worker stopped reading
                (requests are a few bytes each and the async depth bounds them:
                a full socket means it is stuck).
        """
        channel = self._channels.get(uid)
        if channel is None:
            raise OSError("its same-host channel closed")
        with channel.lock:
            channel.sock.sendall(encode_request(value))

    def drop(self, uid: int) -> None:
        """Closes ``uid``'s channel (any thread); nothing is reported for it."""
        with self._lock:
            self._dropped.append(uid)
        self._wake()

    def close(self, timeout: float) -> None:
        """Closes every channel and the listener, and ends the thread (bounded, idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._thread.join(timeout)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _serve(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._selector.select():
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._take_drops()
                    else:
                        self._read(key.data)
        except Exception:  # never silent: the collection's calls then time out as stuck
            logger.exception("the same-host inbox stopped")
        finally:
            for channel in list(self._channels.values()):
                channel.sock.close()
            self._channels.clear()
            self._selector.close()

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while True:
                sock, _ = self._listener.accept()
                sock.setblocking(False)
                self._selector.register(sock, selectors.EVENT_READ, _Channel(sock))

    def _take_drops(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            dropped, self._dropped = self._dropped, []
        for uid in dropped:
            channel = self._channels.pop(uid, None)
            if channel is not None:
                self._forget(channel)

    def _forget(self, channel: _Channel) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(channel.sock)
        channel.sock.close()

    def _read(self, channel: _Channel) -> None:
        try:
            messages = channel.reader.read()
        except Exception as exc:  # closed, or a message that did not unpickle: the channel cannot go on
            self._forget(channel)
            if channel.uid is not None and self._channels.pop(channel.uid, None) is channel:
                cause = "closed" if isinstance(exc, EOFError) else f"failed ({type(exc).__name__}: {exc})"
                self._on_answer(channel.uid, None, f"its same-host channel {cause}")
            return
        for message in messages:
            if channel.uid is None:
                self._hello(channel, message)
            elif message.get("status") == "OK":
                self._on_answer(channel.uid, (True, message["result"]), "")
            else:
                self._on_answer(channel.uid, (False, message["exception"]), "")

    def _hello(self, channel: _Channel, message: Any) -> None:
        """Adopts a channel whose first message carries this inbox's token and an offered uid."""
        valid = isinstance(message, dict) and hmac.compare_digest(str(message.get("token")), self.token)
        uid = message["uid"] if valid else None
        with self._lock:
            future = self._expected.pop(uid, None) if valid else None
        if future is None:
            logger.warning("a same-host channel without a valid offer was refused")
            self._forget(channel)
            return
        channel.uid = uid
        self._channels[uid] = channel
        future.set_result(True)
