"""Failure accounting and the restart budget; episodes, policy lag, time split and the logger in stats()."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

import dask
import pytest
from makers import cartpole_policy, make_cartpole

from daskcollect import CollectorLostError, DaskCollector
from daskcollect.monitoring.stats import FailureCounters


def test_counts_and_budget():
    f = FailureCounters()
    f.lost(2, 500, "collector 1 on tcp://127.0.0.1:1: its worker left the cluster")
    f.restarts += 1
    f.check_budget(1)  # 1 restart of 1 allowed
    assert f.as_dict() == {
        "frames_lost": 1000,
        "rollouts_lost": 2,
        "restarts": 1,
        "env_restarts": 0,
        "retired": 0,
    }
    f.env_restarts += 1
    with pytest.raises(
        CollectorLostError, match="restarted 2 times, more than max_collector_restarts=1"
    ) as info:
        f.check_budget(1)
    assert "Last failure: collector 1 on tcp://127.0.0.1:1" in str(info.value)
    assert info.value.restarts == 1 and info.value.env_restarts == 1


# --- episodes, policy lag and the time split, from a live collection ---------------------------


def driver_episodes(batches) -> tuple[list[float], list[int]]:
    """Returns and lengths of the episodes that ended, computed on the driver from the batches.

    Trajectory ids are unique across the collection, so each episode's frames are
    grouped by id whatever the order the collectors' batches came in.
    """
    rewards: dict[int, float] = defaultdict(float)
    lengths: Counter = Counter()
    ended = set()
    for batch in batches:
        flat = batch.reshape(-1)
        ids = flat["collector", "traj_ids"].tolist()
        for t, r, d in zip(
            ids, flat["next", "reward"].squeeze(-1).tolist(), flat["next", "done"].squeeze(-1).tolist()
        ):
            rewards[t] += r
            lengths[t] += 1
            if d:
                ended.add(t)
    return [rewards[t] for t in ended], [lengths[t] for t in ended]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_episode_stats_match_the_batches(client, sync):
    with dask.config.set({"daskcollect.dashboard.episode-window": 100_000}):
        with DaskCollector(
            make_cartpole, frames_per_batch=100, total_frames=3000, num_collectors=2, client=client, sync=sync
        ) as c:
            batches = [b.clone() for b in c]
            stats = c.stats()
    returns, lengths = driver_episodes(batches)
    assert stats["episodes"] == len(returns) > 50
    assert stats["episode_return_mean"] == pytest.approx(sum(returns) / len(returns))
    assert stats["episode_length_mean"] == pytest.approx(sum(lengths) / len(lengths))
    assert sum(row["episodes"] for row in stats["collectors"]) == stats["episodes"]
    # No weights were sent: every rollout used version 0, as the driver did.
    assert stats["policy_lag"] == 0 and stats["policy_lag_max"] == 0
    for split in [stats["time_split"], *(row["time_split"] for row in stats["collectors"])]:
        assert set(split) == {"env", "policy", "weights", "output", "other"}
        assert split["env"] > 0 and split["policy"] > 0 and min(split.values()) >= 0


def test_policy_lag_counts_versions_behind(client):
    policy = cartpole_policy()
    with DaskCollector(
        make_cartpole, policy, frames_per_batch=200, total_frames=200 * 12, num_collectors=2, client=client
    ) as c:
        for _ in c:
            c.update_policy_weights_()  # a new version after every batch
        stats = c.stats()
    # Async with one call in flight per collector: a batch that arrives was started before
    # at most the last one or two updates.
    assert 0 < stats["policy_lag"] <= 2 and stats["policy_lag_max"] <= 3
    assert all(row["policy_lag"] is not None for row in stats["collectors"])


def test_logger_gets_the_stats_as_scalars(client, tmp_path):
    from torchrl.record import CSVLogger

    logger = CSVLogger("run", log_dir=str(tmp_path))
    logged = logger.experiment.scalars  # what the CSV files get, line by line
    frames = 0
    with dask.config.set({"daskcollect.dashboard.report-interval": "200ms"}):
        with DaskCollector(
            make_cartpole,
            frames_per_batch=100,
            total_frames=-1,
            num_collectors=2,
            client=client,
            logger=logger,
        ) as c:
            for batch, _ in zip(c, range(10_000)):  # bounded: until three reports were logged
                frames += batch.numel()
                if len(logged["collector/frames"]) >= 3:
                    break
    scalars = tmp_path / "run" / "scalars" / "collector"
    lines = [line.split(",") for line in (scalars / "frames.csv").read_text().split()]
    assert len(lines) >= 4  # three reports, then the final snapshot
    assert all(int(step) == int(float(value)) for step, value in lines)  # the frame count is the step
    assert float(lines[-1][1]) == frames  # the final snapshot, logged at shutdown
    for name in ("episode_return_mean", "frames_per_second", "policy_lag", "time_env_ms", "restarts"):
        assert (scalars / f"{name}.csv").stat().st_size > 0, name


class BrokenLogger:
    """A logger whose backend is gone."""

    def __init__(self):
        self.calls = 0

    def log_metrics(self, metrics, step=None):
        self.calls += 1
        raise OSError("the logging backend is unreachable")


def test_a_raising_logger_never_stops_collection(client):
    warnings_seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings_seen.append(record.getMessage())
    logging.getLogger("torchrl").addHandler(handler)
    logger = BrokenLogger()
    after_failure = 0
    try:
        with dask.config.set({"daskcollect.dashboard.report-interval": "100ms"}):
            with DaskCollector(
                make_cartpole,
                frames_per_batch=100,
                total_frames=-1,
                num_collectors=2,
                client=client,
                logger=logger,
            ) as c:
                for _, _ in zip(c, range(10_000)):  # bounded: until the logger failed three times
                    after_failure += logger.calls > 0
                    if logger.calls >= 3 and after_failure >= 10:
                        break
    finally:
        logging.getLogger("torchrl").removeHandler(handler)
    assert logger.calls >= 3 and after_failure >= 10  # batches kept coming after it raised
    assert len([m for m in warnings_seen if "unreachable" in m]) == 1
