"""Collect on a PBS Pro / Torque cluster through dask-jobqueue, with a fixed number of jobs.

    pip install "daskcollect[jobqueue]"
    python examples/pbs.py --queue workq --jobs 8

Each PBS job holds one single-threaded Dask worker process, which hosts one
collector. The select statement asks PBS for exactly that: one CPU per job.
Workers retire a few minutes before the walltime; daskcollect closes their
collectors first (nothing lost) and, with a fixed num_collectors, moves each
collector to a free worker or waits for the replacement job.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from dask_jobqueue import PBSCluster
from distributed import Client
from torchrl.envs import GymEnv

from daskcollect import DaskCollector

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--queue", default=None, help="PBS queue")
parser.add_argument("--interface", default="lo", help="network interface of scheduler and workers")
parser.add_argument("--jobs", type=int, default=4)
parser.add_argument("--frames", type=int, default=1_000_000)


def build_cluster(queue=None, interface="lo", walltime="02:00:00") -> PBSCluster:
    """A PBSCluster of single-CPU jobs, each one worker process with one thread."""
    return PBSCluster(
        queue=queue,
        cores=1,
        processes=1,
        memory="4GB",
        walltime=walltime,
        resource_spec="select=1:ncpus=1:mem=4GB",
        interface=interface,
        job_script_prologue=["export OMP_NUM_THREADS=1", "export DASK_DISTRIBUTED__WORKER__DAEMON=False"],
        worker_extra_args=["--resources", "collector=1", "--lifetime", "115m", "--lifetime-stagger", "2m"],
    )


def make_env():
    return GymEnv("CartPole-v1")


if __name__ == "__main__":
    args = parser.parse_args()
    cluster = build_cluster(args.queue, args.interface)
    print(cluster.job_script())
    if shutil.which("qsub") is None:  # off a PBS login node: stop before scale() tries to submit
        cluster.close()
        sys.exit("pbs.py: qsub is not on PATH. Run this on a PBS login node; above is the job script.")
    cluster.scale(jobs=args.jobs)
    with Client(cluster) as client:
        client.wait_for_workers(args.jobs, timeout=600)  # jobs wait in the queue first
        collector = DaskCollector(
            make_env,
            frames_per_batch=1000,
            total_frames=args.frames,
            num_collectors=args.jobs,
            sync=True,
            worker_resources={"collector": 1},
            client=client,
        )
        with collector:
            for batch in collector:
                print(batch.shape)  # train on batch ([collectors, 1000 / collectors]) here
            print(collector.stats())
    cluster.close()
