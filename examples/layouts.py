"""The three layouts of N CPUs, from TorchRL's seed issue, on one LocalCluster.

    python examples/layouts.py            # N = 4
    python examples/layouts.py --cpus 8

1. One collector that steps N envs in a ParallelEnv.
2. N/2 collectors of 2 envs each.
3. N collectors of one env each.

Each layout collects the same number of frames and prints its throughput
(start-up included). docs/api.md ("Which layout") says when each pays off.
"""

from __future__ import annotations

import argparse
import time

from distributed import Client, LocalCluster
from torchrl.envs import GymEnv

from daskcollect import DaskCollector


def make_env():
    return GymEnv("CartPole-v1")


def collect(client, num_collectors, envs_per_collector, frames):
    start = time.perf_counter()
    with DaskCollector(
        make_env,
        frames_per_batch=1000,
        total_frames=frames,
        num_collectors=num_collectors,
        num_workers_per_collector=envs_per_collector,  # a ParallelEnv when > 1
        client=client,
    ) as collector:
        shapes = {tuple(batch.shape) for batch in collector}
    return shapes, frames / (time.perf_counter() - start)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpus", type=int, default=4, help="N, even and >= 4 for three distinct layouts")
    parser.add_argument("--frames", type=int, default=10_000)
    args = parser.parse_args()
    n = args.cpus
    layouts = {}  # the same (collectors, envs) pair is run once (N = 2 has two layouts)
    for collectors, envs in [(1, n), (max(n // 2, 1), min(n, 2)), (n, 1)]:
        layouts.setdefault(f"{collectors} collector(s) x {envs} env(s)", (collectors, envs))
    # Workers must not be daemons to start a ParallelEnv's processes.
    import dask

    with dask.config.set({"distributed.worker.daemon": False}):
        cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        )
    with cluster, Client(cluster) as client:
        for name, (collectors, envs) in layouts.items():
            shapes, fps = collect(client, collectors, envs, args.frames)
            print(f"{name:28s} batch shapes {sorted(shapes)}  {fps:8.0f} frames/s (incl. start-up)")
