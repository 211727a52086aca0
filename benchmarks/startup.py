"""P6: start-up, from a running cluster to the first batch, against MultiSyncCollector's.

Each pair: a fresh loopback cluster is started and waited for (not timed): a
scheduler, and --workers worker processes started by the ``dask worker``
command, as on a real cluster (LocalCluster's own workers would re-import this
script, torch included, before the clock starts). Then the time from
``DaskCollector(...)`` to its first batch, which includes importing torch and
torchrl on the workers; then the time from ``MultiSyncCollector(...)`` (which
starts its own processes) to its first batch. Same env, policy and batch.

    python benchmarks/startup.py --workers 4 --pairs 3

Writes benchmarks/results/startup.json and prints the median ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings

from _common import header, median_ratio, save
from distributed import Client, LocalCluster
from makers import cartpole_policy, make_cartpole
from torchrl.collectors import MultiSyncCollector

from daskcollect import DaskCollector

warnings.filterwarnings("ignore")


def first_batch(build) -> float:
    start = time.perf_counter()
    collector = build()
    try:
        next(iter(collector))
        return time.perf_counter() - start
    finally:
        collector.shutdown()


def worker_processes(address: str, n: int) -> subprocess.Popen:
    """``dask worker`` processes on loopback, one thread each, as a user would start them."""
    exe = os.path.join(os.path.dirname(sys.executable), "dask")
    return subprocess.Popen(
        [exe, "worker", address, "--nworkers", str(n), "--nthreads", "1", "--host", "127.0.0.1",
         "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--frames-per-batch", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    n, fpb = args.workers, args.frames_per_batch
    raw: dict[str, list[float]] = {"dask": [], "torchrl": []}
    for _ in range(args.pairs):
        with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None) as cluster:
            workers = worker_processes(cluster.scheduler_address, n)
            try:
                with Client(cluster, set_as_default=False) as client:
                    client.wait_for_workers(n, timeout=120)
                    raw["dask"].append(first_batch(lambda: DaskCollector(
                        make_cartpole, cartpole_policy(), frames_per_batch=fpb, total_frames=-1,
                        num_collectors=n, sync=True, client=client)))  # fmt: skip
            finally:
                workers.terminate()
                workers.wait(timeout=60)
        raw["torchrl"].append(first_batch(lambda: MultiSyncCollector(
            [make_cartpole] * n, cartpole_policy(), frames_per_batch=fpb, total_frames=-1)))  # fmt: skip
        print(f"dask {raw['dask'][-1]:6.2f} s   torchrl {raw['torchrl'][-1]:6.2f} s", flush=True)
    summary = {
        "dask_s": statistics.median(raw["dask"]),
        "torchrl_s": statistics.median(raw["torchrl"]),
        "dask/torchrl": median_ratio(raw["dask"], raw["torchrl"]),
    }
    save({**header("P6-startup", args), "raw_seconds": raw, "summary": summary}, "startup", args.out)
    print(summary)


if __name__ == "__main__":
    main()
