"""The local lane: rollout calls of collectors on the driver's host over a Unix socket."""

from __future__ import annotations

import queue
import threading
from multiprocessing import AuthenticationError

import dask
import pytest
import torch
from tensordict import TensorDict

from daskcollect import DaskCollector
from daskcollect.lane import LaneClient, LaneServer
from daskcollect.testing import cartpole_policy, make_cartpole


def server_threads() -> set[threading.Thread]:
    """The driver's lane threads (a worker's end, LaneClient, ends on its own after close)."""
    return {
        t for t in threading.enumerate() if t.name in ("daskcollect-lane-accept", "daskcollect-lane-read")
    }


def test_a_request_and_its_answer_cross_the_lane_and_a_closed_end_is_reported(tmp_path):
    answers: queue.SimpleQueue = queue.SimpleQueue()
    before = server_threads()
    server = LaneServer(str(tmp_path), lambda uid, answer: answers.put((uid, answer)))
    served = []

    def serve(request):
        served.append(request)
        return True, TensorDict({"obs": torch.arange(6.0).reshape(3, 2)}, batch_size=[3])

    try:
        client = LaneClient(server.address, 7, serve)
        conn = server.connection(7, timeout=10)
        assert conn is not None
        conn.send("weights-ref")
        uid, (ok, batch) = answers.get(timeout=10)
        assert (uid, ok, served) == (7, True, ["weights-ref"])
        assert torch.equal(batch["obs"], torch.arange(6.0).reshape(3, 2))
        batch["obs"] += 1  # rebuilt over writable memory
        client.close()  # the worker's end goes: the driver hears it
        assert answers.get(timeout=10) == (7, None)
    finally:
        server.close()
    server.close()  # idempotent
    assert not (tmp_path / "lane.sock").exists()
    assert server_threads() == before  # its threads ended, the accept thread too (not left in accept())


def test_a_large_batch_of_odd_sizes_crosses_the_lane_intact_and_aligned(tmp_path):
    """One message carries many frames: a 4 MB one, odd sizes, an empty tensor, bfloat16, nesting."""
    answers: queue.SimpleQueue = queue.SimpleQueue()
    server = LaneServer(str(tmp_path), lambda uid, answer: answers.put((uid, answer)))
    sent = TensorDict(
        {
            "pixels": torch.randint(0, 256, (64, 128, 128, 4), dtype=torch.uint8),  # 4 MB
            "odd": torch.randint(0, 256, (3, 7), dtype=torch.uint8),
            "empty": torch.zeros(0, 5),
            "half": torch.randn(5, 3).to(torch.bfloat16),
            "next": {"obs": torch.randn(5, 3, dtype=torch.float64)},
            "done": torch.zeros(5, 1, dtype=torch.bool),
        },
        batch_size=[],
    )
    try:
        client = LaneClient(server.address, 3, lambda request: (True, sent))
        conn = server.connection(3, timeout=10)
        for _ in range(3):  # back to back on the same connection
            conn.send(None)
            uid, (ok, got) = answers.get(timeout=30)
            assert (uid, ok) == (3, True)
            for key in sent.keys(True, True):
                assert got[key].dtype == sent[key].dtype and torch.equal(got[key], sent[key]), key
                if got[key].numel():
                    assert got[key].data_ptr() % 16 == 0, key  # rebuilt aligned inside the one buffer
        client.close()
    finally:
        server.close()


def test_a_wrong_key_is_refused(tmp_path):
    from daskcollect.lane import LaneAddress

    server = LaneServer(str(tmp_path), lambda uid, answer: None)
    try:
        with pytest.raises(AuthenticationError, match="digest"):
            LaneClient(LaneAddress(server.address.path, b"not the key"), 1, lambda r: (True, None))
        assert server.connection(1, timeout=1) is None
    finally:
        server.close()


def lane_threads(dask_worker) -> int:
    """The worker's lane threads (one per collector that takes its calls over the lane)."""
    return sum(t.name.startswith("daskcollect-lane-") for t in threading.enumerate())


@pytest.mark.parametrize("lane", [True, False])
def test_collectors_on_the_driver_host_take_the_lane_unless_it_is_off(client, lane):
    with dask.config.set({"daskcollect.local-lane": lane}):
        with DaskCollector(
            make_cartpole, cartpole_policy(), frames_per_batch=50, total_frames=1000, num_collectors=2,
            sync=False, client=client,
        ) as collector:  # fmt: skip
            frames = sum(b.numel() for b in collector)
            assert sorted(client.run(lane_threads).values()) == [int(lane)] * 2
    assert frames == 1000


def test_background_stats_while_the_lane_delivers(client):
    """stats() from another thread while the lane's reader thread hands rollouts over."""
    with DaskCollector(
        make_cartpole, cartpole_policy(), frames_per_batch=20, total_frames=2000, num_collectors=2,
        sync=False, client=client,
    ) as collector:  # fmt: skip
        errors = []
        done = threading.Event()

        def poll():
            while not done.is_set():
                try:
                    collector.stats()
                except Exception as exc:
                    errors.append(exc)

        thread = threading.Thread(target=poll)
        thread.start()
        try:
            frames = sum(b.numel() for b in collector)
        finally:
            done.set()
            thread.join(timeout=10)
    assert frames == 2000 and errors == []
