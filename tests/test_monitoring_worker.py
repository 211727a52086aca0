"""What each rollout measures on its worker: episode returns and lengths across batches, the time split.

Checked against TorchRL's own bookkeeping: ``RewardSum`` writes each episode's
return and ``StepCounter`` its length, so every episode end in a batch must
match them, including episodes that span batches and batched envs.
"""

from __future__ import annotations

import time

import pytest
import torch
from makers import make_cartpole, make_pendulum
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.envs import RewardSum, SerialEnv, StepCounter, TransformedEnv

from daskcollect.monitoring.stats import TIME_PARTS
from daskcollect.monitoring.worker import EpisodeTracker, TimeSplit


def counted(maker):
    return TransformedEnv(maker(), RewardSum()).append_transform(StepCounter())


def cartpole_counted():
    return counted(make_cartpole)


def serial_cartpoles():
    return SerialEnv(3, cartpole_counted)


def torchrl_episodes(batch) -> tuple[list[float], list[int]]:
    """Returns and lengths of the episodes ending in ``batch``, from RewardSum and StepCounter."""
    done = batch["next", "done"].squeeze(-1)
    return (
        batch["next", "episode_reward"][done].flatten().tolist(),
        batch["next", "step_count"][done].flatten().tolist(),
    )


@pytest.mark.parametrize("make_env", [cartpole_counted, serial_cartpoles], ids=["one env", "3 envs"])
@pytest.mark.parametrize("reset_at_each_iter", [False, True])
def test_episodes_match_torchrl_across_batches(make_env, reset_at_each_iter):
    torch.manual_seed(0)
    # 37 frames per env and batch: most CartPole episodes (random policy) span two batches.
    envs = 3 if make_env is serial_cartpoles else 1
    collector = Collector(
        make_env,
        None,
        frames_per_batch=37 * envs,
        total_frames=37 * envs * 30,
        reset_at_each_iter=reset_at_each_iter,
    )
    tracker = EpisodeTracker()
    seen = 0
    for batch in collector:
        returns, lengths = tracker.update(batch)
        expected_returns, expected_lengths = torchrl_episodes(batch)
        # With reset_at_each_iter, episodes cut by the reset never end, and none is carried over.
        assert sorted(returns) == pytest.approx(sorted(expected_returns))
        assert sorted(lengths) == sorted(expected_lengths)
        seen += len(returns)
    collector.shutdown()
    assert seen > 20


def test_truncated_episodes_and_missing_keys():
    torch.manual_seed(0)
    collector = Collector(truncated_pendulum, None, frames_per_batch=150, total_frames=600)
    tracker = EpisodeTracker()
    ends = 0
    for batch in collector:
        returns, lengths = tracker.update(batch)
        expected_returns, expected_lengths = torchrl_episodes(batch)
        assert returns == pytest.approx(expected_returns) and list(lengths) == expected_lengths
        ends += len(returns)
        assert tracker.update(batch.exclude(("next", "reward"))) is None  # nothing to count
    collector.shutdown()
    assert ends == 6  # truncated every 100 steps


def truncated_pendulum():
    return TransformedEnv(make_pendulum(), RewardSum()).append_transform(StepCounter(max_steps=100))


def test_time_split_times_env_and_policy_in_place():
    collector = Collector(make_cartpole, None, frames_per_batch=200, total_frames=-1)
    split = TimeSplit()
    assert split.instrument(collector)
    split.start()
    start = time.perf_counter()
    batch = next(iter(collector))
    total = time.perf_counter() - start
    parts = split.finish(total)
    collector.shutdown()
    assert batch.numel() == 200 and set(parts) == set(TIME_PARTS)
    assert parts["env"] > 0 and parts["policy"] > 0 and parts["weights"] == 0
    assert sum(parts.values()) == pytest.approx(total)


def test_time_split_of_a_multiprocess_collector_is_other():
    collector = MultiSyncCollector([make_cartpole], None, frames_per_batch=50, total_frames=50)
    try:
        assert not TimeSplit().instrument(collector)
    finally:
        collector.shutdown()
