"""Where collectors run: private clusters, given clients, addresses, files, resources."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import psutil
import pytest
from distributed import Client
from helpers import add_worker_with, environment, noise, wait_until
from makers import make_cartpole, make_env_reading_variable

from daskcollect import DaskCollector


def test_address_and_scheduler_file(cluster, tmp_path):
    with DaskCollector(
        make_cartpole, frames_per_batch=20, total_frames=40, client=cluster.scheduler_address
    ) as collector:
        assert collector.num_collectors == 2
        assert len(list(collector)) == 2
    assert cluster.status.name == "running"  # a given cluster stays up

    # A scheduler file as `dask scheduler --scheduler-file` writes it. (Client.write_scheduler_file
    # fails once workers report fine performance metrics, whose keys are tuples.)
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps({"type": "Scheduler", "address": cluster.scheduler_address}))
    with DaskCollector(make_cartpole, frames_per_batch=20, total_frames=40, scheduler_file=str(path)) as col:
        assert len(list(col)) == 2


def test_worker_resources_placement(make_cluster):
    cluster = make_cluster(n_workers=2)
    with Client(cluster, set_as_default=False) as client:
        gpu_worker = [add_worker_with(cluster, client, {"GPU": 1})]  # only it may host a collector
        with DaskCollector(
            make_cartpole, frames_per_batch=20, total_frames=40, worker_resources={"GPU": 1}, client=client
        ) as collector:
            assert collector.num_collectors == 1  # only one worker is eligible
            assert collector.workers == gpu_worker
            assert len(list(collector)) == 2


SCRIPT = """
import sys
from torchrl.envs import GymEnv
from daskcollect import DaskCollector

if __name__ == "__main__":
    env_name = "CartPole-v1"
    horizon = 5  # CartPole cannot terminate this early, so every episode is truncated
    # A lambda closing over __main__'s variables: the workers never saw this file.
    make_env = lambda: GymEnv(env_name, max_episode_steps=horizon)
    for _ in range(int(sys.argv[2])):  # connect, collect and close again: the scheduler's log stays clean
        with DaskCollector(make_env, frames_per_batch=100, total_frames=300, scheduler_file=sys.argv[1]) as c:
            n = 0
            for batch in c:
                n += 1
                assert batch["next", "truncated"].any()
            print("BATCHES", n, c.num_collectors)
"""


def _spawn(args, log):
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.timeout(300)
def test_main_script_lambda_against_cli_scheduler_and_workers(tmp_path):
    """`dask scheduler` and `dask worker` started by hand, a script with a __main__ lambda.

    The script connects and closes five times: no warning in its output, and no
    traceback in the scheduler's log (a client closed while the scheduler still
    had a message for it used to leave a ``CommClosedError`` there).
    """
    sched_file = tmp_path / "scheduler.json"
    dask_cli = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    worker_cli = [sys.executable, "-m", "distributed.cli.dask_worker"]
    log = open(tmp_path / "cluster.log", "w")
    procs = [
        _spawn(
            [
                *dask_cli,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(sched_file),
            ],
            log,
        )
    ]
    try:
        assert wait_until(sched_file.exists, timeout=30), open(tmp_path / "cluster.log").read()
        for _ in range(2):
            procs.append(
                _spawn(
                    [
                        *worker_cli,
                        "--scheduler-file",
                        str(sched_file),
                        "--host",
                        "127.0.0.1",
                        "--nthreads",
                        "1",
                        "--no-dashboard",
                    ],
                    log,
                )
            )
        with Client(scheduler_file=str(sched_file), timeout=30, set_as_default=False) as c:
            c.wait_for_workers(2, timeout=60)
        script = tmp_path / "train.py"
        script.write_text(textwrap.dedent(SCRIPT))
        out = subprocess.run(
            [sys.executable, str(script), str(sched_file), "5"],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.count("BATCHES 3 2") == 5
        assert not noise(out.stderr), out.stderr[-3000:]
        log.flush()
        cluster_log = (tmp_path / "cluster.log").read_text()
        assert "Traceback" not in cluster_log and "CommClosedError" not in cluster_log, cluster_log[-3000:]
    finally:
        for p in reversed(procs):
            p.terminate()
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


@pytest.mark.parametrize("sync", [True, False])
def test_private_cluster_default_size(sync):
    with DaskCollector(make_cartpole, frames_per_batch=20, total_frames=40, sync=sync) as collector:
        assert collector.num_collectors == os.cpu_count()
        assert len(collector.client.scheduler_info(n_workers=-1)["workers"]) == os.cpu_count()
        assert len(list(collector)) == 2
        # Driver, scheduler and workers run uvloop (local-cluster.cluster-config).
        assert type(collector.client.loop.asyncio_loop).__module__.startswith("uvloop")
        assert collector.client.run_on_scheduler(loop_module).startswith("uvloop")
        assert all(m.startswith("uvloop") for m in collector.client.run(loop_module).values())


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_a_scheduler_file_that_never_appears_is_a_clear_error(tmp_path):
    import time

    import dask
    from makers import make_cartpole

    from daskcollect import ClusterConnectionError, DaskCollector

    path = str(tmp_path / "scheduler.json")
    start = time.monotonic()
    with dask.config.set({"daskcollect.timeouts.connect": "2s"}):
        with pytest.raises(ClusterConnectionError, match="scheduler.json") as info:
            DaskCollector(make_cartpole, frames_per_batch=10, scheduler_file=path)
    assert time.monotonic() - start < 15 and info.value.path == path
    assert "dask scheduler --scheduler-file" in str(info.value)


@pytest.mark.parametrize(("setting", "expected"), [(None, 0), ("1GiB", 2**30)])
def test_private_cluster_workers_memory_limit(setting, expected):
    """No per-worker limit by default (Dask would split the host by the number of workers and restart
    collectors whose shared torch libraries push them over); a given one is passed on."""
    import dask

    with dask.config.set({"daskcollect.local-cluster.memory-limit": setting}):
        with DaskCollector(
            make_cartpole, frames_per_batch=20, total_frames=40, num_collectors=1
        ) as collector:
            workers = collector.client.scheduler_info(n_workers=-1)["workers"].values()
            assert [w["memory_limit"] or 0 for w in workers] == [expected]
            assert sum(b.numel() for b in collector) == 40


def test_private_cluster_nannies_restart_workers():
    """The nannies of a private cluster (``DriverNanny``, which leaves the driver's process to the
    scheduler's monitor: ``tests/test_dask_internals.py``) still restart a worker that dies."""
    with DaskCollector(make_cartpole, frames_per_batch=20, total_frames=-1, num_collectors=1) as collector:
        cluster = collector.client.cluster

        def worker_pids() -> set[int]:
            return {nanny.pid for nanny in cluster.workers.values()} - {None}

        (pid,) = worker_pids()
        batches = iter(collector)
        assert next(batches).numel() == 20
        psutil.Process(pid).send_signal(signal.SIGKILL)
        assert wait_until(lambda: len(worker_pids() - {pid}) == 1, timeout=60)
        assert next(batches).numel() == 20  # its collector is rebuilt on the restarted worker


def parent_command(pid: int) -> str:
    return " ".join(psutil.Process(pid).parent().cmdline())


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_private_clusters_workers_start_as_set_with_the_drivers_environment_of_now(start):
    """Forked from the forkserver (``local-cluster.worker-start``), a worker still gets the variables the
    driver set after the server started; spawned, it is the driver's child."""
    late = functools.partial(make_env_reading_variable, "DASKCOLLECT_TEST_LATE")  # raises unless it is set
    with dask.config.set({"daskcollect.local-cluster.worker-start": start}):
        with environment(DASKCOLLECT_TEST_LATE="set after the forkserver started"):
            with DaskCollector(late, frames_per_batch=20, total_frames=40, num_collectors=2) as collector:
                assert sum(batch.numel() for batch in collector) == 40
                parents = [parent_command(pid) for pid in collector.client.run(os.getpid).values()]
    if start == "forkserver":
        assert all("multiprocessing.forkserver" in p for p in parents), parents
    else:
        assert all("multiprocessing.forkserver" not in p for p in parents), parents
