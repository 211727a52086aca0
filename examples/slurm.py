"""Collect on a SLURM cluster through dask-jobqueue, growing and shrinking with adapt().

    pip install "daskcollect[jobqueue]"
    python examples/slurm.py --partition gpu --max-jobs 16

Each SLURM job runs one Dask worker process with one thread: one collector per
worker, as DaskCollector expects. The job script prologue sets the workers'
environment before Python starts. Workers retire themselves a few minutes
before the walltime (--lifetime): daskcollect closes their collectors first,
so no rollout is lost, and adapt() submits fresh jobs that get collectors.
A job that SLURM ends anyway (preemption, scancel) retires the same way on
its SIGTERM, and `--signal=B:USR1@120` gives two minutes' notice: the job's
shell `exec`s the worker, so the signal reaches it (docs/slurm.md).

On a login node whose public interface you may not bind, pass --interface
(e.g. ib0); the default "lo" keeps everything on loopback for local trials.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from dask_jobqueue import SLURMCluster
from distributed import Client
from torchrl.envs import GymEnv

from daskcollect import DaskCollector

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--partition", default=None, help="SLURM partition (queue)")
parser.add_argument("--account", default=None, help="SLURM account (project)")
parser.add_argument("--interface", default="lo", help="network interface of scheduler and workers")
parser.add_argument("--min-jobs", type=int, default=2)
parser.add_argument("--max-jobs", type=int, default=8)
parser.add_argument("--frames", type=int, default=1_000_000)


def build_cluster(partition=None, account=None, interface="lo", walltime="01:00:00") -> SLURMCluster:
    """A SLURMCluster whose workers suit collectors: 1 process, 1 thread, a collector resource."""
    return SLURMCluster(
        queue=partition,
        account=account,
        cores=1,  # one thread per worker process: actor calls share one thread anyway
        processes=1,
        memory="4GB",
        walltime=walltime,
        interface=interface,  # cores=1 already asks SLURM for --cpus-per-task=1
        python=f"exec {sys.executable}",  # the job's shell becomes the worker: --signal=B: reaches it
        job_extra_directives=["--signal=B:USR1@120"],  # retire gracefully 2 minutes before the end
        job_script_prologue=[
            "export OMP_NUM_THREADS=1",
            # Collectors that start sub-processes (ParallelEnv) need non-daemonic workers.
            "export DASK_DISTRIBUTED__WORKER__DAEMON=False",
        ],
        worker_extra_args=[
            "--resources",
            "collector=1",  # only these workers host collectors
            "--lifetime",
            "55m",
            "--lifetime-stagger",
            "2m",  # retire before the 1 h walltime
        ],  # fmt: skip
    )


def make_env():
    return GymEnv("CartPole-v1")


if __name__ == "__main__":
    args = parser.parse_args()
    cluster = build_cluster(args.partition, args.account, args.interface)
    print(cluster.job_script())
    if shutil.which("sbatch") is None:  # off a SLURM login node: stop before adapt() tries to submit
        cluster.close()
        sys.exit("slurm.py: sbatch is not on PATH. Run this on a SLURM login node; above is the job script.")
    cluster.adapt(minimum_jobs=args.min_jobs, maximum_jobs=args.max_jobs)
    with (
        Client(cluster) as client,
        DaskCollector(
            make_env,
            frames_per_batch=1000,
            total_frames=args.frames,
            num_collectors="auto",  # follow the cluster as adapt() adds and retires jobs
            worker_resources={"collector": 1},
            client=client,
        ) as collector,
    ):
        print("dashboard:", client.dashboard_link, "(collectors: /daskcollect)")
        for i, _batch in enumerate(collector):  # train on each batch here
            if i % 100 == 0:
                stats = collector.stats()
                print(
                    f"{stats['frames']} frames, {stats['live_collectors']} collectors, {stats['restarts']} restarts"
                )
    cluster.close()
