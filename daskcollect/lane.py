"""The local lane: rollout calls of collectors on the driver's host over a Unix socket, not a Dask RPC.

A Dask actor call costs the driver about 1.3 ms of CPU (the RPC's message
framing, TCP reads and writes and the event loop's hand-offs; see
docs/scale.md), about four times what TorchRL's multiprocess collectors spend
on a batch through their pipes. For a collector whose worker shares the
driver's host (it reads the driver's shared-memory probe), the lane carries the
same call over a ``multiprocessing`` connection on a Unix socket, as TorchRL's
pipes do: the driver sends the weights reference, the worker answers with the
rollout record, its batch's tensors as out-of-band buffers
(:func:`daskcollect.serialization.dumps`).

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
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

from daskcollect.serialization import dumps, loads

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneAddress:
    """Where an actor on the driver's host connects: the socket's path and the key that admits it."""

    path: str
    authkey: bytes


def send(conn: Connection, obj: Any) -> None:
    """Sends ``obj`` with its tensors as out-of-band frames: their sizes first, then each frame."""
    frames = dumps(obj)
    conn.send([memoryview(f).nbytes for f in frames])
    for frame in frames:
        conn.send_bytes(frame)


def receive(conn: Connection) -> Any:
    """The inverse of :func:`send`; the tensors are rebuilt over writable buffers, without a copy."""
    frames = []
    for size in conn.recv():
        frame = bytearray(size)
        if size:
            conn.recv_bytes_into(frame)
        else:
            conn.recv_bytes()
        frames.append(frame)
    return loads(frames)


def hang_up(conn: Connection) -> None:
    """Shuts the socket down, then closes it: a thread blocked reading it, here or at the other
    end, wakes up to end-of-file (a plain close wakes neither). Idempotent."""
    if conn.closed:
        return
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=conn.fileno())
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()  # the connection owns the descriptor and closes it
    conn.close()


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
        self._conns: dict[int, Connection] = {}
        self._by_conn: dict[Connection, int] = {}
        self._changed = threading.Condition()
        self._closed = False
        # A pipe that wakes the reader when a connection joins or the server closes.
        self._wake_r, self._wake_w = os.pipe()
        self._threads = [
            threading.Thread(target=self._accept, name="daskcollect-lane-accept", daemon=True),
            threading.Thread(target=self._read, name="daskcollect-lane-read", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def connection(self, uid: int, timeout: float) -> Connection | None:
        """The connection of actor ``uid``, waited for (bounded); ``None`` if it did not connect."""
        with self._changed:
            self._changed.wait_for(lambda: uid in self._conns or self._closed, timeout)
            return self._conns.get(uid)

    def drop(self, uid: int) -> None:
        """Closes actor ``uid``'s connection (its worker's lane thread then stops)."""
        with self._changed:
            conn = self._conns.pop(uid, None)
            if conn is not None:
                self._by_conn.pop(conn, None)
        if conn is not None:
            hang_up(conn)
            os.write(self._wake_w, b"x")

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
                uid = int(conn.recv())
            except Exception as exc:  # a bad key, a closed listener, a peer gone at once
                if not self._closed:
                    logger.debug("lane: a connection was refused (%s)", exc)
                continue
            with self._changed:
                self._conns[uid] = conn
                self._by_conn[conn] = uid
                self._changed.notify_all()
            os.write(self._wake_w, b"x")

    def _read(self) -> None:
        while not self._closed:
            with self._changed:
                conns = list(self._by_conn)
            try:
                ready_list = wait([self._wake_r, *conns], timeout=1.0)
            except (OSError, ValueError):  # a connection closed under the wait: look again
                continue
            for ready in ready_list:
                if ready == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                uid = self._by_conn.get(ready)
                if uid is None:
                    continue  # dropped meanwhile
                try:
                    answer = receive(ready)
                except (EOFError, OSError):
                    answer = None
                    with self._changed:
                        self._conns.pop(uid, None)
                        self._by_conn.pop(ready, None)
                    ready.close()
                self._on_answer(uid, answer)

    def close(self) -> None:
        """Closes every connection and the socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._changed:
            conns, self._conns, self._by_conn = list(self._conns.values()), {}, {}
            self._changed.notify_all()
        for conn in conns:
            hang_up(conn)
        os.write(self._wake_w, b"x")
        self._listener.close()  # the accept thread's accept() fails and it ends
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
        self._conn = Client(address.path, family="AF_UNIX", authkey=address.authkey)
        self._conn.send(uid)
        self._serve = serve
        self._thread = threading.Thread(target=self._loop, name=f"daskcollect-lane-{uid}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                request = self._conn.recv()
            except (EOFError, OSError):
                return
            answer = self._serve(request)
            try:
                send(self._conn, answer)
            except (EOFError, OSError):
                return
            except Exception as exc:  # an exception that does not pickle: send what it says
                send(self._conn, (False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]} ({exc})")))

    def close(self) -> None:
        """Closes this end (idempotent); the serving thread ends."""
        hang_up(self._conn)
