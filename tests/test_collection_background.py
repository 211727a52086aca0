"""start() / pause(): background collection into a replay buffer, with TorchRL 0.14's semantics."""

from __future__ import annotations

import time

import pytest
from helpers import collectors_idle, wait_until
from makers import make_cartpole, make_env_failing_after
from torchrl.data import LazyTensorStorage, ReplayBuffer

from daskcollect import ConfigurationError, DaskCollector, RolloutError


def idle(collector: DaskCollector) -> bool:
    """No background collection, and no rollout running on any collector."""
    return not collector.collecting_in_background and collectors_idle(collector)


def test_start_collects_in_the_background_until_total_frames(client):
    rb = ReplayBuffer(storage=LazyTensorStorage(10_000))
    with DaskCollector(make_cartpole, frames_per_batch=100, total_frames=2000, num_collectors=2,
                       replay_buffer=rb, client=client) as collector:  # fmt: skip
        start = time.monotonic()
        collector.start()
        assert time.monotonic() - start < 1.0  # returns at once
        assert wait_until(lambda: not collector.collecting_in_background, timeout=60)  # it ended
        assert len(rb) == 2000  # exactly total_frames, then it stopped
        assert collector.stats()["frames"] == 2000


def test_pause_stops_writes_then_resumes(client):
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    with DaskCollector(make_cartpole, frames_per_batch=100, total_frames=-1, num_collectors=2,
                       replay_buffer=rb, client=client) as collector:  # fmt: skip
        collector.start()
        assert wait_until(lambda: len(rb) >= 500, timeout=60)
        with collector.pause():
            frozen = len(rb)
            assert frozen % 100 == 0  # whole rollouts only
            assert idle(collector)  # nothing in flight and no thread left that could write
            assert collector.stats()["live_collectors"] == 2  # the collector stays usable inside the block
            assert len(rb) == frozen
        assert wait_until(lambda: len(rb) > frozen + 500, timeout=60)  # resumed on exit
        with collector.pause(resume=False):
            pass
        stopped = len(rb)
        assert idle(collector) and len(rb) == stopped


def test_start_needs_a_replay_buffer(client):
    with DaskCollector(make_cartpole, frames_per_batch=100, total_frames=200, client=client) as collector:
        with pytest.raises(ConfigurationError, match="replay_buffer"):
            collector.start()


def test_an_error_in_the_background_reaches_the_next_call(client):
    rb = ReplayBuffer(storage=LazyTensorStorage(10_000))
    collector = DaskCollector(lambda: make_env_failing_after(30), frames_per_batch=20, total_frames=-1,
                              num_collectors=1, replay_buffer=rb, client=client)  # fmt: skip
    try:
        collector.start()
        assert wait_until(lambda: not collector.collecting_in_background, timeout=60)
        with pytest.raises(RolloutError, match="step budget exhausted"):
            collector.state_dict()  # the next call on the collector
    finally:
        collector.shutdown(raise_on_error=False)
