"""The local lane: rollout calls of collectors on the driver's host over a Unix socket, not a Dask RPC.

A Dask actor call costs the driver 0.6-0.8 ms of CPU (the RPC's message
framing, TCP reads and writes and the event loop's hand-offs; see
docs/scale.md), about four times what TorchRL's multiprocess collectors spend
on a batch through their pipes; the lane costs 0.2-0.3 ms. For a collector whose worker shares the
driver's host (it reads the driver's shared-memory probe), the lane carries the
same call over a Unix socket, as TorchRL's pipes do (admitted by
``multiprocessing``'s key handshake): the driver sends the weights reference,
the worker answers with the rollout record in one message, its batch's tensors
as out-of-band frames (:func:`daskcollect.serialization.dumps`) gathered from
their memory on the way out and rebuilt over one buffer on the way in.

Dask still starts, places, watches and closes the actors; only the rollout
calls move. A worker that dies closes its end, which the driver reads as the
collector's loss at once.

- :class:`LaneServer` (driver): listens, accepts one connection per actor, and
  reads answers on its own thread, handing each to a callback.
- :class:`LaneClient` (worker): connects from the actor and serves rollout
  requests on its own thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from daskcollect.serialization import dumps, loads

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneAddress:
    """Where an actor on the driver's host connects: the socket's path and the key that admits it."""

    path: str
    authkey: bytes


# A message: its body's length and frame count, then the body: the frames'
# sizes, then each frame, each part padded to _ALIGN bytes, so that every
# tensor rebuilt over the received body starts aligned. Two reads and one gathered write a
# message, whatever the number of tensors.
_PREFIX = struct.Struct("<QI")
_ALIGN = 16


def _padding(size: int) -> int:
    return -size % _ALIGN


def _table_size(count: int) -> int:
    """Bytes of a message's size table for ``count`` frames, padding included."""
    return 8 * count + _padding(8 * count)


class LaneEnd:
    """One end of a lane connection: whole messages over a connected stream socket.

    Args:
        sock: The socket, connected and admitted (it is owned from here on).
    """

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._sending = threading.Lock()

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._sock.fileno() < 0

    def send(self, obj: Any) -> None:
        """Sends ``obj``; its tensors go as out-of-band frames, gathered from their memory (no copy).

        Raises:
            OSError: If the other end is gone.
        """
        frames = dumps(obj)
        sizes = [memoryview(f).nbytes for f in frames]
        table = struct.pack(f"<{len(frames)}Q", *sizes).ljust(_table_size(len(frames)), b"\0")
        body = len(table) + sum(size + _padding(size) for size in sizes)
        parts: list[Any] = [_PREFIX.pack(body, len(frames)), table]
        for frame, size in zip(frames, sizes):
            parts.append(frame)
            if _padding(size):
                parts.append(bytes(_padding(size)))
        with self._sending:
            _send_all(self._sock, parts)

    def receive(self) -> Any:
        """The next message, rebuilt over one writable buffer without another copy.

        Raises:
            EOFError: If the other end closed.
        """
        prefix = bytearray(_PREFIX.size)
        _read_exact(self._sock, memoryview(prefix))
        body_size, count = _PREFIX.unpack(prefix)
        body = memoryview(bytearray(body_size))
        _read_exact(self._sock, body)
        sizes = struct.unpack_from(f"<{count}Q", body)
        frames, offset = [], _table_size(count)
        for size in sizes:
            frames.append(body[offset : offset + size])
            offset += size + _padding(size)
        return loads(frames)

    def hang_up(self) -> None:
        """Shuts the socket down, then closes it: a thread blocked reading it, here or at the other
        end, wakes up to end-of-file (a plain close wakes neither). Idempotent."""
        if self.closed:
            return
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _read_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if not got:
            raise EOFError("the lane closed")
        view = view[got:]


def _admitted(conn: Connection) -> LaneEnd:
    """The socket under a ``multiprocessing`` connection that has done the key handshake."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    conn.close()
    sock.setblocking(True)
    return LaneEnd(sock)


class LaneServer:
    """The driver's end: one connection per actor, answers read on one thread.

    Args:
        directory: A folder on the driver's host that the workers there can
            reach (the shared-memory transport's).
        on_answer: Called on the reader thread with ``(uid, answer)`` for each
            answer, and ``(uid, None)`` when an actor's connection closes.
    """

    def __init__(self, directory: str, on_answer: Callable[[int, Any], None]):
        self.address = LaneAddress(os.path.join(directory, "lane.sock"), os.urandom(16))
        self._listener = Listener(self.address.path, family="AF_UNIX", authkey=self.address.authkey)
        self._on_answer = on_answer
        self._conns: dict[int, LaneEnd] = {}
        self._changed = threading.Condition()
        self._joining: list[tuple[int, LaneEnd]] = []
        self._leaving: list[LaneEnd] = []
        self._closed = False
        # The reader's selector is only touched on its thread; joins and drops
        # are handed over through the lists above and this wake-up pipe.
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._threads = [
            threading.Thread(target=self._accept, name="daskcollect-lane-accept", daemon=True),
            threading.Thread(target=self._read, name="daskcollect-lane-read", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def connection(self, uid: int, timeout: float) -> LaneEnd | None:
        """The connection of actor ``uid``, waited for (bounded); ``None`` if it did not connect."""
        with self._changed:
            self._changed.wait_for(lambda: uid in self._conns or self._closed, timeout)
            return self._conns.get(uid)

    def drop(self, uid: int) -> None:
        """Closes actor ``uid``'s connection (its worker's lane thread then stops)."""
        with self._changed:
            end = self._conns.pop(uid, None)
            if end is not None:
                self._leaving.append(end)
        if end is not None:
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed: the reader has gone already
            os.write(self._wake_w, b"x")

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
                uid = int(conn.recv())
                end = _admitted(conn)
            except Exception as exc:  # a bad key, a closed listener, a peer gone at once
                if not self._closed:
                    logger.debug("lane: a connection was refused (%s)", exc)
                continue
            with self._changed:
                self._conns[uid] = end
                self._joining.append((uid, end))
                self._changed.notify_all()
            self._wake()

    def _update_selector(self) -> None:
        """Registers joined connections and closes dropped ones (on the reader thread)."""
        os.read(self._wake_r, 4096)
        with self._changed:
            joining, self._joining = self._joining, []
            leaving, self._leaving = self._leaving, []
        for uid, end in joining:
            if not end.closed:  # dropped before it was ever read
                self._selector.register(end, selectors.EVENT_READ, uid)
        for end in leaving:
            self._forget(end)

    def _forget(self, end: LaneEnd) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(end)
        end.hang_up()

    def _read(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=1.0):
                if key.data is None:
                    self._update_selector()
                    continue
                end, uid = key.fileobj, key.data
                if end.closed:
                    continue  # dropped during this round
                try:
                    answer = end.receive()
                except (EOFError, OSError):
                    answer = None
                    with self._changed:
                        if self._conns.get(uid) is end:
                            del self._conns[uid]
                    self._forget(end)
                self._on_answer(uid, answer)
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                key.fileobj.hang_up()
        self._selector.close()

    def close(self) -> None:
        """Closes every connection and the socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._changed:
            ends, self._conns = list(self._conns.values()), {}
            ends += [end for _, end in self._joining] + self._leaving
            self._changed.notify_all()
        for end in ends:
            end.hang_up()  # wakes the workers' lane threads at once
        self._wake()
        # Closing a listening socket does not wake a thread blocked in accept():
        # a connection does, and the accept thread, seeing _closed, ends.
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as knock:
            knock.connect(self.address.path)
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)
        if os.path.exists(self.address.path):
            os.unlink(self.address.path)


class LaneClient:
    """The worker's end: serves rollout requests from the driver on a thread of its own.

    The thread ends when the driver closes the lane (the collector was dropped,
    or the collection closed) or goes away.

    Args:
        address: The driver's lane.
        uid: The actor incarnation (how the driver knows the connection).
        serve: Runs one request (a weights reference or ``None``) and returns
            ``(ok, rollout or exception)``.
    """

    def __init__(self, address: LaneAddress, uid: int, serve: Callable[[Any], tuple[bool, Any]]):
        conn = Client(address.path, family="AF_UNIX", authkey=address.authkey)
        conn.send(uid)
        self._end = _admitted(conn)
        self._serve = serve
        self._thread = threading.Thread(target=self._loop, name=f"daskcollect-lane-{uid}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                request = self._end.receive()
            except (EOFError, OSError):
                return
            answer = self._serve(request)
            try:
                self._end.send(answer)
            except (EOFError, OSError):
                return
            except Exception as exc:  # an exception that does not pickle: send what it says
                self._end.send((False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]} ({exc})")))

    def close(self) -> None:
        """Closes this end (idempotent); the serving thread ends."""
        self._end.hang_up()
