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
after it, each read into a buffer of its own that the rebuilt batch views.
A buffer of :data:`SLOT_MIN_BYTES` or more (a pixel batch) does not cross the
socket: the worker copies it into a slot of its :class:`SlotRing`, anonymous
shared memory (``memfd``) whose descriptor the driver receives once
(``SCM_RIGHTS``) and keeps mapped, and the batch the driver yields views the
slot: no copy and no page fault on the driver. The slot goes back to the
worker (a :class:`Release` request) when the last view of it is garbage, so a
worker never writes memory that a batch still shows; a worker whose slots are
all lent out sends inline, so a learner that keeps its batches slows nothing
and loses nothing. Requests are a length and a pickle.
"""

from __future__ import annotations

import array
import contextlib
import hmac
import logging
import mmap
import os
import pickle
import secrets
import selectors
import socket
import struct
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy

logger = logging.getLogger(__name__)

#: An answer's prefix: its pickle's length and how many out-of-band buffers it has; then, for each,
#: its slot (-1: inline, after the pickle) and its length.
HEAD = struct.Struct("<II")
#: Buffers from this size up travel in a shared-memory slot (below, the socket's copy costs less than
#: a slot's bookkeeping).
SLOT_MIN_BYTES = 1 << 20
#: Slots a worker lends at most per channel: the async depth's rollouts, and the batches the learner holds.
MAX_SLOTS = 4
#: Descriptors one read can carry (a message brings at most one per new slot).
_ANCILLARY = socket.CMSG_SPACE(MAX_SLOTS * array.array("i").itemsize)
#: A request's prefix: its pickle's length.
REQUEST = struct.Struct("<I")

#: ``on_answer(uid, outcome, cause)``, as :data:`daskcollect.streams.driver.OnAnswer`.
OnAnswer = Callable[[int, "tuple[bool, Any] | None", str], None]


def available() -> bool:
    """Whether this platform has abstract Unix sockets (Linux)."""
    return sys.platform.startswith("linux")


@dataclass
class Message:
    """One encoded answer: the parts to write in order, and the descriptors of slots new to the driver."""

    parts: list[Any]
    fds: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Release:
    """A request that gives slot ``slot`` back to its worker."""

    slot: int


class SlotRing:
    """A worker's shared-memory slots for one channel (thread-safe: the actor's thread fills them, the
    event loop frees them)."""

    def __init__(self, max_slots: int = MAX_SLOTS):
        self.max_slots = max_slots
        self._lock = threading.Lock()
        self._slots: dict[int, tuple[int, mmap.mmap]] = {}
        self._free: set[int] = set()
        self._closed = False

    def take(self, nbytes: int) -> tuple[int, mmap.mmap, int | None] | None:
        """A free slot of ``nbytes`` or more (a new one while under the limit, with its descriptor to
        send); ``None`` when all are lent out."""
        with self._lock:
            if self._closed:
                return None
            fits = [i for i in self._free if len(self._slots[i][1]) >= nbytes]
            if fits:
                slot = min(fits, key=lambda i: len(self._slots[i][1]))
                self._free.discard(slot)
                return slot, self._slots[slot][1], None
            if len(self._slots) >= self.max_slots:
                return None
            fd = os.memfd_create("daskcollect-slot", os.MFD_CLOEXEC)
            size = 1 << (nbytes - 1).bit_length()  # room for batches that grow a little
            os.ftruncate(fd, size)
            slot = len(self._slots)
            self._slots[slot] = (fd, mmap.mmap(fd, size))
            return slot, self._slots[slot][1], fd

    def release(self, slot: int) -> None:
        with self._lock:
            if slot in self._slots:
                self._free.add(slot)

    def sizes(self) -> dict[str, int]:
        return {"slots": len(self._slots), "free": len(self._free)}

    def close(self) -> None:
        """Closes every slot here (idempotent); the driver's mappings keep their memory while it needs it."""
        with self._lock:
            self._closed = True
            slots, self._slots = self._slots, {}
        for fd, mapped in slots.values():
            os.close(fd)
            with contextlib.suppress(BufferError):  # a view still exported: freed with it
                mapped.close()


def encode(answer: Any, ring: SlotRing | None = None) -> Message:
    """``answer`` as one message: a header (prefix, buffer table, pickle), then its out-of-band buffers
    that travel inline; large ones go into ``ring``'s slots where it has one free."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(answer, protocol=5, buffer_callback=buffers.append)
    table, inline, fds = [], [], []
    for raw in (b.raw() for b in buffers):
        taken = ring.take(raw.nbytes) if ring is not None and raw.nbytes >= SLOT_MIN_BYTES else None
        if taken is None:
            table += [-1, raw.nbytes]
            inline.append(raw)
            continue
        slot, mapped, fd = taken
        mapped[: raw.nbytes] = raw
        table += [slot, raw.nbytes]
        fds += [fd] if fd is not None else []
    head = HEAD.pack(len(data), len(buffers)) + struct.pack(f"<{len(table)}q", *table) + data
    return Message([head, *inline], fds)


def encode_request(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=5)
    return REQUEST.pack(len(data)) + data


class Reader:
    """Rebuilds one channel's messages from non-blocking reads, whatever their split.

    Args:
        sock: The connected socket, non-blocking.
        on_release: Called with a slot's number when no batch views it any more (any thread).
    """

    def __init__(self, sock: socket.socket, on_release: Callable[[int], None] | None = None):
        self.sock, self._on_release = sock, on_release
        self._fds: list[int] = []  # received with the bytes, in order: one per slot new to this end
        self._slots: dict[int, mmap.mmap] = {}
        self._start()

    def _start(self) -> None:
        self._target: Any = bytearray(HEAD.size)
        self._filled, self._stage = 0, "head"
        self._data = bytearray()
        self._table: list[tuple[int, int]] = []
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
                    n, ancillary, _, _ = self.sock.recvmsg_into([view], _ANCILLARY)
                except (BlockingIOError, InterruptedError):
                    return done
                self._take_fds(ancillary)
                if n == 0:
                    raise EOFError("the channel closed")
                self._filled += n
                if n < view.nbytes:
                    continue
            message = self._advance()
            if message is not None:
                done.append(message)

    def _take_fds(self, ancillary: list) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self._fds += fds

    def _advance(self) -> Any:
        """Moves past a filled target; the message when it was the last."""
        if self._stage == "head":
            size, count = HEAD.unpack(self._target)
            self._data, self._stage = bytearray(size), "table"
            self._target, self._filled = bytearray(16 * count), 0
            return None
        if self._stage == "table":
            flat = struct.unpack(f"<{len(self._target) // 8}q", self._target)
            self._table = list(zip(flat[::2], flat[1::2]))
            self._target, self._filled, self._stage = self._data, 0, "buffers"
            return None
        if self._target is not self._data:
            self._buffers.append(self._target)
        while len(self._buffers) < len(self._table):
            slot, nbytes = self._table[len(self._buffers)]
            if slot < 0:
                # Not zeroed first, as bytearray(n) would be: recv writes every byte.
                self._target, self._filled = numpy.empty(nbytes, numpy.uint8), 0
                return None
            self._buffers.append(self._lend(slot, nbytes))
        message = pickle.loads(self._data, buffers=self._buffers)
        self._start()
        return message

    def _lend(self, slot: int, nbytes: int) -> numpy.ndarray:
        """A view of a slot's first ``nbytes`` that gives the slot back when it is garbage."""
        if slot not in self._slots:
            fd = self._fds.pop(0)
            try:
                self._slots[slot] = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)  # the mapping keeps the memory
        view = numpy.frombuffer(self._slots[slot], numpy.uint8, count=nbytes)
        if self._on_release is not None:
            # Not at interpreter exit: the worker's end is gone then, or closes its slots itself.
            weakref.finalize(view, self._on_release, slot).atexit = False
        return view

    def close(self) -> None:
        """Closes the descriptors not mapped yet; the mappings go with the last batch viewing them."""
        for fd in self._fds:
            os.close(fd)
        self._fds, self._slots = [], {}


class _Channel:
    """The driver's end of one channel: its reader, and a lock for the requests written to it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.reader = sock, Reader(sock, self.release)
        self.uid: int | None = None  # known from its hello
        # Reentrant: a batch's release can run in a garbage collection that a sending thread triggered.
        self.lock = threading.RLock()

    def send(self, value: Any) -> None:
        data = encode_request(value)
        with self.lock:
            self.sock.sendall(data)

    def release(self, slot: int) -> None:
        """Gives a slot back (from whichever thread dropped the last view of it)."""
        with contextlib.suppress(OSError):  # the channel closed: its worker has gone, and so has the slot
            self.send(Release(slot))


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
        channel.send(value)

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
                channel.reader.close()
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
        channel.reader.close()

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
