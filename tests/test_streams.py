"""Completion streams: every collector's rollouts run in Dask's actor runner and come back over a Dask comm."""

from __future__ import annotations

import dask
import pytest
import torch
from distributed.protocol import dumps, loads
from helpers import streams_served, wait_until
from makers import StackedPixelEnvMaker, make_cartpole_in_worker_context, worker_context_policy
from tensordict import TensorDict

from daskcollect import DaskCollector
from daskcollect.streams.worker import serialized


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_user_code_sees_its_worker_on_the_drivers_host(client, sync):
    """The env's constructor and steps and the policy's forward call ``get_worker()`` (the env raises
    without it); every frame names, through the policy, the worker of the collector that made it."""
    with DaskCollector(
        make_cartpole_in_worker_context, worker_context_policy(0), frames_per_batch=40, total_frames=240,
        num_collectors=2, sync=sync, client=client,
    ) as collector:  # fmt: skip
        batches = []
        for i, batch in enumerate(collector):
            batches.append(batch)
            if i == 0:
                collector.update_policy_weights_()
        collectors = collector.stats()["collectors"]
    assert {c["weights_route"] for c in collectors} == {"shared-memory"}  # the driver's host
    worker_of = {c["collector_id"]: port(c["worker"]) for c in collectors}
    frames = 0
    for batch in batches:
        flat = batch.reshape(-1)
        for cid, worker in zip(flat["collector", "collector_id"].tolist(), flat["worker_port"].tolist()):
            assert worker == worker_of[cid]
        frames += flat.numel()
    assert frames == 240 and len(set(worker_of.values())) == 2


@pytest.mark.parametrize("same_host", [True, False], ids=["same-host", "dask-comm"])
def test_each_collector_streams_over_one_comm_that_closes_with_it(client, same_host):
    """On the driver's host the answers take the same-host channel (daskcollect.streams.same-host),
    off it the worker's Dask comm; the streams close with their collectors either way."""
    with dask.config.set({"daskcollect.streams.same-host": same_host}), DaskCollector(
        make_cartpole_in_worker_context, frames_per_batch=20, total_frames=-1, num_collectors=2, client=client
    ) as collector:  # fmt: skip
        next(iter(collector))
        streams = client.run(streams_served)
        assert sorted(len(s) for s in streams.values()) == [1, 1]
        routes = {a for s in streams.values() for a in s.values()}
        assert routes == {"same-host"} if same_host else all(a.startswith("tcp://") for a in routes)
        sizes = collector.session.sizes()
        assert sizes.get("same-host channels", 0) == (2 if same_host else 0)
    assert wait_until(lambda: not any(client.run(streams_served).values()), timeout=10)


@pytest.mark.parametrize("compression", [False, "zlib"])
def test_a_rollout_serialized_in_the_actor_reads_back_through_dasks_protocol(compression):
    """What the actor thread serializes is what the driver's comm rebuilds; where the user turns
    Dask's comm compression on, the frames travel compressed."""
    batch = TensorDict({"pixels": torch.zeros(8, 84, 84, dtype=torch.uint8), "reward": torch.randn(8)}, [8])
    with dask.config.set({"distributed.comm.compression": compression}):
        frames = dumps([{"status": "OK", "result": serialized({"batch": batch})}])
    size = sum(memoryview(f).nbytes for f in frames)
    (answer,) = loads(frames)
    assert bool((answer["result"]["batch"] == batch).all())
    assert (size < 10_000) if compression else (size > 8 * 84 * 84)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_pixel_batches_on_the_drivers_host_stay_right_while_the_learner_keeps_them(client, sync):
    """Batches of 100 Atari-sized frames (5.6 MB) come back in the workers' shared-memory slots; a
    learner that keeps all of them (more than the slots) reads every one as it was collected: each
    frame's step counter follows its predecessor's within an episode, and the frames add up."""
    with DaskCollector(
        StackedPixelEnvMaker(0.0), None, frames_per_batch=100, total_frames=2400, num_collectors=2,
        sync=sync, client=client,
    ) as collector:  # fmt: skip
        kept = list(collector)
    assert sum(b.numel() for b in kept) == 2400
    for batch in kept:
        flat = batch.reshape(-1)
        step, after = flat["pixels"][:, 0, 0, 0].long(), flat["next", "pixels"][:, 0, 0, 0].long()
        assert bool((after == (step + 1) % 256).all())
        assert bool((flat["next", "pixels"][:, 1:] == flat["pixels"][:, 1:]).all())  # the frame's other bytes
