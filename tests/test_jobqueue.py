"""dask-jobqueue: the example clusters' job scripts, and collection on jobqueue's own job machinery."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import dask
import pytest
from distributed import Client
from helpers import slurm_unavailable, wait_until
from makers import make_cartpole

from daskcollect import DaskCollector

jobqueue_local = pytest.importorskip("dask_jobqueue.local", reason="the 'jobqueue' extra is not installed")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = {"daskcollect.restart-delay": "0.2s"}


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slurm_job_script():
    cluster = example("slurm").build_cluster(partition="rl", account="proj42", walltime="01:00:00")
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    for line in ["#SBATCH -p rl", "#SBATCH -A proj42", "#SBATCH -t 01:00:00", "#SBATCH --cpus-per-task=1",
                 "export OMP_NUM_THREADS=1", "export DASK_DISTRIBUTED__WORKER__DAEMON=False",
                 "#SBATCH --signal=B:USR1@120"]:  # fmt: skip
        assert line in script.splitlines(), line
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert len(directives) == len(set(directives)), directives  # none twice
    command = script.strip().splitlines()[-1]
    assert command.startswith(f"exec {sys.executable} -m distributed.cli.dask_worker")  # B: signals reach it
    for option in ["--nthreads 1", "--resources collector=1", "--lifetime 55m", "--interface lo", "--nanny"]:
        assert option in command, option
    assert "127.0.0.1" in command  # the scheduler is on loopback (interface="lo")


def test_pbs_job_script():
    cluster = example("pbs").build_cluster(queue="workq")
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#PBS -q workq" in script and "#PBS -l select=1:ncpus=1:mem=4GB" in script
    assert (
        "#PBS -l walltime=02:00:00" in script
        and "--nthreads 1" in script
        and "--resources collector=1" in script
    )


@pytest.mark.parametrize(
    ("name", "submit", "directive"), [("slurm", "sbatch", "#SBATCH"), ("pbs", "qsub", "#PBS")]
)
def test_hpc_example_off_a_cluster_fails_fast(name, submit, directive):
    """Without the scheduler's submit command: the job script, one line naming what is missing, exit 1."""
    if shutil.which(submit) is not None:
        pytest.skip(f"{submit} is installed here")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", f"{name}.py")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert directive in out.stdout  # the job script it would submit
    assert out.stderr.strip().splitlines() == [
        f"{name}.py: {submit} is not on PATH. Run this on a {name.upper()} login node; above is the job script."
    ]


def test_collect_on_jobqueue_jobs_with_scale_and_adapt(make_cluster):
    """Real job scripts run as local processes (dask_jobqueue.local.LocalCluster): scale up, down, adapt.

    Where SLURM is installed, tests/test_slurm.py does all of this on real SLURM jobs (grown and shrunk by
    adapt(), retired at their walltime, preempted), so this stand-in runs only where it is not.
    """
    if slurm_unavailable() is None:
        pytest.skip("tests/test_slurm.py collects on real SLURM jobs here")
    cluster = jobqueue_local.LocalCluster(
        cores=1, processes=1, memory="2GB", interface="lo", worker_extra_args=["--resources", "collector=1"]
    )
    try:
        cluster.scale(jobs=2)
        with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
            client.wait_for_workers(2, timeout=60)
            with DaskCollector(
                make_cartpole, frames_per_batch=100, total_frames=-1, num_collectors="auto",
                worker_resources={"collector": 1}, client=client,
            ) as collector:  # fmt: skip
                it = iter(collector)
                batches = [next(it) for _ in range(3)]

                def live_becomes(live: int):
                    return lambda: batches.append(next(it)) or collector.stats()["live_collectors"] == live

                cluster.scale(jobs=3)  # a job joins: it gets a collector
                client.wait_for_workers(3, timeout=60)
                # Each check takes a batch (next() is the bounded wait), so no sleep between them.
                assert wait_until(live_becomes(3), timeout=60, interval=0), "grow"
                cluster.scale(jobs=1)  # two jobs leave: their collectors close first
                assert wait_until(live_becomes(1), timeout=60, interval=0), "shrink"
                cluster.adapt(minimum_jobs=2, maximum_jobs=2)
                assert wait_until(live_becomes(2), timeout=90, interval=0), "adapt"
                batches += [next(it) for _ in range(5)]
                stats = collector.stats()
    finally:
        cluster.close()
    assert stats["retired"] == 2 and stats["rollouts_lost"] == 0 and stats["restarts"] == 0
    ids = {int(i) for b in batches for i in b["collector", "collector_id"].unique()}
    assert len(ids) >= 4  # 2 first collectors, the third job's, and adapt()'s
