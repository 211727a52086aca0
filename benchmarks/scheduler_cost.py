"""The scheduler's CPU while a collection runs, as the number of workers grows (docs/scale.md).

A ``dask scheduler`` and ``dask worker --nworkers N`` processes on loopback, as
a user starts them. For each N, the scheduler process's CPU (user + system) is
read over --seconds with the cluster idle, then over --seconds while a
``DaskCollector`` (async, one collector per worker, an env whose step sleeps
--step seconds) runs on it. The collection's own cost is the difference: what
grows with N in the idle figure is Dask's (heartbeats), what grows in the
difference would be the collection's.

    python benchmarks/scheduler_cost.py --workers 4 32 --seconds 20

Writes benchmarks/results/scheduler_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import psutil
from _common import header, save
from driver_cost import cpu_seconds, external_cluster, stop
from makers import SleepEnvMaker

from daskcollect import DaskCollector

warnings.filterwarnings("ignore")


def scheduler_cpu_per_s(scheduler: psutil.Process, seconds: float, work=None) -> dict[str, float]:
    """The scheduler's CPU in ms per second over ``seconds``, while ``work()`` (if given) runs each turn."""
    cpu0, start, turns = cpu_seconds(scheduler), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        if work is None:
            time.sleep(0.1)
        else:
            work()
        turns += 1
    elapsed = time.perf_counter() - start
    return {"ms_per_s": 1e3 * (cpu_seconds(scheduler) - cpu0) / elapsed, "turns": turns}


def one(n: int, args) -> dict[str, float]:
    scheduler_proc, workers, address = external_cluster(n)
    try:
        scheduler = psutil.Process(scheduler_proc.pid)
        time.sleep(2)  # the workers' registration traffic has settled
        idle = scheduler_cpu_per_s(scheduler, args.seconds)
        with DaskCollector(
            SleepEnvMaker(args.step), None, frames_per_batch=args.frames_per_batch, total_frames=-1,
            num_collectors=n, sync=False, client=address,
        ) as collector:  # fmt: skip
            batches = iter(collector)
            next(batches)
            collecting = scheduler_cpu_per_s(scheduler, args.seconds, lambda: next(batches))
        return {
            "idle_ms_per_s": idle["ms_per_s"],
            "collecting_ms_per_s": collecting["ms_per_s"],
            "collection_ms_per_s": collecting["ms_per_s"] - idle["ms_per_s"],
            "batches_per_s": collecting["turns"] / args.seconds,
        }
    finally:
        stop(workers, scheduler_proc)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--step", type=float, default=0.01, help="seconds each env step sleeps")
    parser.add_argument("--frames-per-batch", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds per window")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = header("scheduler_cost", args)
    result["runs"] = {str(n): [one(n, args) for _ in range(args.repeats)] for n in args.workers}
    result["medians"] = {
        n: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for n, runs in result["runs"].items()
    }
    print(
        f"{'workers':>8} {'idle ms/s':>10} {'collecting ms/s':>16} {'collection ms/s':>16} {'batches/s':>10}"
    )
    for n, m in result["medians"].items():
        print(
            f"{n:>8} {m['idle_ms_per_s']:10.1f} {m['collecting_ms_per_s']:16.1f} "
            f"{m['collection_ms_per_s']:16.1f} {m['batches_per_s']:10.0f}"
        )
    save(result, "scheduler_cost", args.out)


if __name__ == "__main__":
    main()
