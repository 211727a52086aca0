"""daskcollect.collection.checkpoint: a checkpoint continues on a new DaskCollector, and a killed driver resumes.

The audit of a resumed run: exactly ``total_frames`` frames, no
``(collector_id, rollout_id)`` pair twice, every trajectory's transitions
consecutive (each frame's ``next`` state is the following frame's state), and
with ``restore_envs=True`` on a stateless env in sync mode, the frames of an
uninterrupted run, value for value.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from audit import audit, flat, saved_batches
from helpers import Forked, changes_left, wait_until
from makers import cartpole_policy, make_cartpole, make_stateless_pendulum, pendulum_policy
from resumable_driver import FRAMES_PER_BATCH, TOTAL_FRAMES

from daskcollect import ConfigurationError, DaskCollector
from daskcollect.testing import cluster_state


def pendulum_collector(client, sync: bool = True, total_frames: int = 320) -> DaskCollector:
    return DaskCollector(make_stateless_pendulum, pendulum_policy(), frames_per_batch=40, total_frames=total_frames,
                         sync=sync, seed=5, max_frames_per_traj=25, num_collectors=2, client=client)  # fmt: skip


def test_a_checkpoint_continues_a_stateless_env_value_for_value(client):
    with pendulum_collector(client) as reference:
        uninterrupted = list(reference)
    with pendulum_collector(client) as first:
        batches = iter(first)
        before = [next(batches) for _ in range(3)]
        state = first.state_dict()
    assert state["frames"] == 3 * 40 and [c["rollouts"] for c in state["collectors"]] == [3, 3]
    with pendulum_collector(client) as second:
        second.load_state_dict(state, restore_envs=True)
        after = list(second)
    assert len(before) + len(after) == len(uninterrupted) == 8
    for ours, theirs in zip(before + after, uninterrupted):
        for key in ("th", "thdot", "action", ("next", "th"), ("collector", "traj_ids")):
            assert torch.equal(ours[key], theirs[key]), key
    audit(before + after, 320)


def test_without_restoring_envs_each_collector_starts_new_trajectories(client):
    with DaskCollector(make_cartpole, cartpole_policy(), frames_per_batch=40, total_frames=200, sync=True,
                       seed=3, num_collectors=2, client=client) as first:  # fmt: skip
        batches = iter(first)
        before = [next(batches) for _ in range(2)]
        state = first.state_dict()
    with DaskCollector(make_cartpole, cartpole_policy(), frames_per_batch=40, total_frames=200, sync=True,
                       seed=3, num_collectors=2, client=client) as second:  # fmt: skip
        second.load_state_dict(state)
        after = list(second)
    frames = flat(before + after)
    assert frames.numel() == 200 and len(after) == 3
    old = set(flat(before)["collector", "traj_ids"].tolist())
    new = set(flat(after)["collector", "traj_ids"].tolist())
    assert not old & new  # the old trajectories end at the checkpoint; the new ones have new ids
    pairs = list(
        zip(frames["collector", "collector_id"].tolist(), frames["collector", "rollout_id"].tolist())
    )
    assert len(set(pairs)) == len(pairs) // 20


def test_a_checkpoint_that_does_not_fit_is_refused(client):
    with pendulum_collector(client) as first:
        state = first.state_dict()
    with DaskCollector(make_stateless_pendulum, pendulum_policy(), frames_per_batch=80, total_frames=320,
                       sync=True, num_collectors=2, client=client) as other:  # fmt: skip
        with pytest.raises(ConfigurationError, match="frames_per_batch=40"):
            other.load_state_dict(state)
        with pytest.raises(ConfigurationError, match="not a DaskCollector checkpoint"):
            other.load_state_dict({"frames": 3})


def run_driver(address: str, folder: str, mode: str, envs: str) -> Forked:
    """``tests/resumable_driver.py`` in a process of its own, forked from the suite's forkserver."""
    return Forked("resumable_driver:main", address, folder, mode, envs)


def ours_left(dask_worker) -> list:
    return list(dask_worker.state.actors) + [p for p in dask_worker.plugins if p.startswith("daskcollect")]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.timeout(300)  # long by nature; others share the 2 cores meanwhile
def test_a_driver_killed_mid_run_resumes_from_its_last_checkpoint(client, tmp_path, mode):
    before = cluster_state(client)
    address, folder = client.scheduler.address, str(tmp_path)
    driver = run_driver(address, folder, mode, "restore")
    try:
        wait_until(lambda: len([n for n in os.listdir(folder) if n.startswith("batch-")]) >= 5, timeout=120)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    assert not os.path.exists(os.path.join(folder, "done"))
    # The dead driver's actors go with its client; the scheduler removes its worker plugins.
    wait_until(lambda: not any(client.run(ours_left, callback_timeout=30).values()), timeout=60)
    resumed = run_driver(address, folder, mode, "restore")
    assert resumed.wait(timeout=240) == 0
    assert os.path.exists(os.path.join(folder, "done"))
    batches = saved_batches(folder)
    audit(batches, TOTAL_FRAMES)
    if mode == "sync":
        with DaskCollector(make_stateless_pendulum, pendulum_policy(), frames_per_batch=FRAMES_PER_BATCH,
                           total_frames=TOTAL_FRAMES, sync=True, seed=11, max_frames_per_traj=25,
                           num_collectors=2, client=client) as reference:  # fmt: skip
            for ours, theirs in zip(batches, reference, strict=True):
                assert torch.equal(ours["th"], theirs["th"]) and torch.equal(ours["action"], theirs["action"])
    assert changes_left(client, before, timeout=30) == []
    seconds = float(open(os.path.join(folder, "resumed_in.txt")).read())
    recollected = int(open(os.path.join(folder, "recollected.txt")).read())
    print(f"{mode}: resumed to its first batch in {seconds:.2f} s; {recollected} frames collected again")
    assert 0 <= recollected <= 2 * FRAMES_PER_BATCH
    assert seconds < 60
