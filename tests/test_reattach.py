"""daskcollect.reattach.driver: a driver killed mid-run, restarted within the grace period, takes over its
collectors as they are; after the grace period nothing of the killed driver's collection is left.

Each driver is ``tests/resumable_driver.py`` in a process of its own, on the session's cluster, with
``daskcollect.reattach.grace-period`` set through its environment.
"""

from __future__ import annotations

import ast
import os
import signal

import dask
import pytest
import torch
from audit import audit, saved_batches
from helpers import Forked, changes_left, wait_until
from makers import envs_built, make_stateless_pendulum, pendulum_policy
from resumable_driver import FRAMES_PER_BATCH, TOTAL_FRAMES

from daskcollect import ConfigurationError, DaskCollector
from daskcollect.reattach.driver import RUN_PREFIX
from daskcollect.testing import cluster_state


def run_driver(address: str, folder: str, mode: str, grace: str) -> Forked:
    """``tests/resumable_driver.py`` in a process of its own, forked from the suite's forkserver."""
    env = {"DASK_DASKCOLLECT__REATTACH__GRACE_PERIOD": grace}
    return Forked("resumable_driver:main", address, folder, mode, "restore", "reattach", env=env)


def kill_after(driver: Forked, folder: str, batches: int) -> None:
    try:
        wait_until(
            lambda: len([n for n in os.listdir(folder) if n.startswith("batch-")]) >= batches, timeout=120
        )
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    assert not os.path.exists(os.path.join(folder, "done"))


def runs(client) -> list[str]:
    return [name for name in client.list_datasets(callback_timeout=30) if str(name).startswith(RUN_PREFIX)]


def actors(dask_worker) -> int:
    return len(dask_worker.state.actors)


@pytest.mark.timeout(300)  # long by nature; others share the 2 cores meanwhile
def test_a_driver_restarted_within_the_grace_period_takes_over_its_collectors(client, tmp_path):
    before = cluster_state(client)
    address, folder = client.scheduler.address, str(tmp_path)
    earlier = sum(client.run(envs_built, callback_timeout=30).values())
    kill_after(run_driver(address, folder, "sync", "120s"), folder, batches=5)
    pids, built = client.run(os.getpid, callback_timeout=30), client.run(envs_built, callback_timeout=30)
    assert sum(built.values()) == earlier + 2
    # The killed driver's collectors wait for a new one, published under its run's name.
    assert len(runs(client)) == 1
    assert sum(client.run(actors, callback_timeout=30).values()) == 2
    resumed = run_driver(address, folder, "sync", "120s")
    assert resumed.wait(timeout=240) == 0
    assert ast.literal_eval(open(os.path.join(folder, "reattached.txt")).read()) == [0, 1]
    # No env was built again, in the same worker processes.
    assert client.run(os.getpid, callback_timeout=30) == pids
    assert client.run(envs_built, callback_timeout=30) == built
    batches = saved_batches(folder)
    audit(batches, TOTAL_FRAMES)
    with DaskCollector(make_stateless_pendulum, pendulum_policy(), frames_per_batch=FRAMES_PER_BATCH,
                       total_frames=TOTAL_FRAMES, sync=True, seed=11, max_frames_per_traj=25,
                       num_collectors=2, client=client) as reference:  # fmt: skip
        for ours, theirs in zip(batches, reference, strict=True):
            assert torch.equal(ours["th"], theirs["th"]) and torch.equal(ours["action"], theirs["action"])
    assert changes_left(client, before, timeout=30) == []
    seconds = float(open(os.path.join(folder, "resumed_in.txt")).read())
    recollected = int(open(os.path.join(folder, "recollected.txt")).read())
    print(f"re-attached: resumed to its first batch in {seconds:.2f} s; {recollected} frames collected again")


def test_after_the_grace_period_nothing_of_a_killed_driver_is_left(client, tmp_path):
    before = cluster_state(client)
    address, folder = client.scheduler.address, str(tmp_path)
    built = sum(client.run(envs_built, callback_timeout=30).values())
    kill_after(run_driver(address, folder, "async", "3s"), folder, batches=5)
    assert changes_left(client, before, timeout=60) == []
    assert runs(client) == []
    # A driver started later resumes from the checkpoint with new collectors.
    resumed = run_driver(address, folder, "async", "3s")
    assert resumed.wait(timeout=240) == 0
    assert ast.literal_eval(open(os.path.join(folder, "reattached.txt")).read()) == []
    assert sum(client.run(envs_built, callback_timeout=30).values()) == built + 4
    audit(saved_batches(folder), TOTAL_FRAMES)
    assert changes_left(client, before, timeout=30) == []


def test_a_run_its_driver_still_runs_is_not_taken_over(client):
    with dask.config.set({"daskcollect.reattach.grace-period": "60s"}):
        with DaskCollector(make_stateless_pendulum, pendulum_policy(), frames_per_batch=FRAMES_PER_BATCH,
                           total_frames=400, sync=True, num_collectors=2, client=client) as first:  # fmt: skip
            next(iter(first))
            state = first.state_dict()
            assert state["run"] in runs(client)
            with pytest.raises(ConfigurationError, match="still run by a driver connected"):
                DaskCollector(make_stateless_pendulum, pendulum_policy(), frames_per_batch=FRAMES_PER_BATCH,
                              total_frames=400, sync=True, num_collectors=2, client=client, resume_from=state)  # fmt: skip
        assert runs(client) == []  # a driver that shuts down unpublishes its run
