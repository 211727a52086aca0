"""Same-host channels: messages survive any split, only an offered worker with the token gets in,
requests reach the worker's end, and a closed channel is reported once."""

from __future__ import annotations

import asyncio
import gc
import io
import queue
import socket
import threading

import pytest
import torch
from helpers import wait_until
from tensordict import TensorDict

from daskcollect.collection.polling import apoll_until
from daskcollect.streams import local
from daskcollect.streams.packing import Packer
from daskcollect.streams.worker import SameHostChannel

pytestmark = pytest.mark.skipif(not local.available(), reason="abstract Unix sockets are Linux's")


def batch() -> TensorDict:
    return TensorDict(
        {"obs": torch.arange(24.0).reshape(6, 4), "done": torch.zeros(6, 1, dtype=torch.bool)}, batch_size=[6]
    )


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20], ids=["bytewise", "odd-chunks", "whole"])
def test_a_reader_rebuilds_messages_whatever_the_split(chunk):
    """A packed batch (one out-of-band buffer), a plain value (none) and an error come out in order,
    as the worker encoded them, however the bytes arrive."""
    packed = Packer().pack(batch(), stream=1)
    messages = [
        {"status": "OK", "result": packed},
        {"status": "OK", "result": [1, "two"]},
        {"status": "error", "exception": ValueError("bad")},
    ]
    wire = b"".join(bytes(memoryview(p).cast("B")) for m in messages for p in local.encode(m).parts)
    a, b = socket.socketpair()
    b.setblocking(False)
    reader, got = local.Reader(b), []
    for i in range(0, len(wire), chunk):
        a.sendall(wire[i : i + chunk])
        got += reader.read()
    assert len(got) == 3
    assert (got[0]["result"] == batch()).all() and got[1]["result"] == [1, "two"]
    saved = io.BytesIO()
    torch.save(got[0]["result"], saved)  # the views over the received buffer own storages torch can save
    saved.seek(0)
    assert (torch.load(saved, weights_only=False) == batch()).all()
    assert isinstance(got[2]["exception"], ValueError)
    a.close()
    with pytest.raises(EOFError):
        reader.read()
    b.close()


def connect(name: str, hello: dict) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(name)
    sock.sendall(local.encode(hello).parts[0])
    return sock


def test_an_inbox_takes_offered_channels_only_and_reports_a_closed_one_once():
    answers: queue.Queue = queue.Queue()
    inbox = local.Inbox(lambda uid, outcome, cause: answers.put((uid, outcome, cause)))
    try:
        offer, joined = inbox.offer(7)
        stranger = connect(offer["name"], {**offer, "token": "guessed"})
        assert stranger.recv(1) == b""  # refused: closed at once
        assert not inbox.has(7) and not joined.done()
        worker = connect(offer["name"], offer)
        assert joined.result(timeout=5) is True and inbox.has(7)
        for part in local.encode({"status": "OK", "result": "a rollout"}).parts:
            worker.sendall(part)
        assert answers.get(timeout=5) == (7, (True, "a rollout"), "")
        inbox.request(7, {"weights": 3})
        (size,) = local.REQUEST.unpack(worker.recv(local.REQUEST.size))
        assert worker.recv(size) == local.encode_request({"weights": 3})[local.REQUEST.size :]
        worker.close()
        uid, outcome, cause = answers.get(timeout=5)
        assert (uid, outcome) == (7, None) and "same-host channel closed" in cause
        assert wait_until(lambda: not inbox.has(7), timeout=5)
        with pytest.raises(OSError, match="closed"):
            inbox.request(7, None)
        offer, joined = inbox.offer(8)
        dropped = connect(offer["name"], offer)
        joined.result(timeout=5)
        inbox.drop(8)
        assert dropped.recv(1) == b""  # closed by the driver; nothing reported for a dropped one
        assert answers.empty() and inbox.sizes() == {"same-host channels": 0, "same-host offers": 0}
    finally:
        inbox.close(5)
        inbox.close(5)  # idempotent
    assert not any(t.name == "daskcollect-same-host" for t in threading.enumerate())


@pytest.mark.parametrize("keep", [False, True], ids=["released", "kept-by-the-learner"])
def test_the_workers_end_sends_through_the_inbox_large_batches_in_slots_lent_until_released(keep):
    """Requests reach the worker's end; a 4 MB buffer comes back in a shared-memory slot (the worker's
    memory, mapped by the driver) and the slot returns to the worker only once the driver's last view
    of it is gone. A learner that keeps every batch gets them all, inline once the slots are lent out."""
    answers: queue.Queue = queue.Queue()
    inbox = local.Inbox(lambda uid, outcome, cause: answers.put((uid, outcome)))
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MB
    packer, kept = Packer(), []

    def packed(i: int):
        return packer.pack(TensorDict({"x": big + i}, []), stream=2)

    async def worker_side(offer, joined):
        channel = await SameHostChannel.connect(offer)
        await asyncio.wait_for(asyncio.wrap_future(joined), 5)  # the driver's end took the hello
        requests: asyncio.Queue = asyncio.Queue()
        closed = asyncio.Event()
        reading = asyncio.ensure_future(channel.read_requests(requests, closed.set))
        inbox.request(1, "w1")
        first = await asyncio.wait_for(requests.get(), 5)
        rounds = local.MAX_SLOTS + 2
        for i in range(rounds):
            channel.deliver(
                {"status": "OK", "result": local.encode({"status": "OK", "result": packed(i)}, channel.ring)}
            )
            uid, (ok, value) = await asyncio.to_thread(answers.get, timeout=5)
            assert uid == 1 and ok and torch.equal(value["x"], big + i)
            if keep:
                kept.append(value)
            del value
            gc.collect()
            lent = min(i + 1, local.MAX_SLOTS) if keep else 1
            want = {"slots": lent, "free": 0 if keep else 1}
            assert await apoll_until(lambda want=want: channel.ring.sizes() == want, 5), (
                i,
                channel.ring.sizes(),
            )
        channel.deliver({"status": "error", "exception": KeyError("lost")})
        (_, (failed, exc)) = await asyncio.to_thread(answers.get, timeout=5)
        inbox.drop(1)  # the driver closes the channel: the worker's end ends its stream
        await asyncio.wait_for(closed.wait(), 5)
        await asyncio.wait_for(reading, 5)
        channel.abort()
        return first, failed, exc

    try:
        offer, joined = inbox.offer(1)
        first, failed, exc = asyncio.run(asyncio.wait_for(worker_side(offer, joined), 30))
        assert first == "w1" and not failed and isinstance(exc, KeyError)
        # The worker has closed its slots; the batches the learner kept still read right.
        assert all(torch.equal(v["x"], big + i) for i, v in enumerate(kept))
    finally:
        inbox.close(5)


def test_a_worker_that_cannot_reach_the_inbox_stays_on_its_stream():
    offer = {"name": "\0daskcollect-nobody-listens", "token": "t", "uid": 0}
    assert asyncio.run(SameHostChannel.connect(offer)) is None
