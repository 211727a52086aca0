"""P2: coordination overhead at scale, with an env whose step sleeps 10 ms (no CPU work to speak of).

For each worker count N, interleaved in one process: DaskCollector (async),
TorchRL's MultiAsyncCollector, and one single-process TorchRL Collector on the
same env. The ideal is N x the single collector's frames/s; the report is the
median over the pairs of each side's fraction of that ideal. The first batch
of every run is excluded from timing.

    python benchmarks/scaling.py --workers 4 8 16 --pairs 3

Writes benchmarks/results/scaling.json and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from _common import header, save
from makers import SleepEnvMaker
from torchrl.collectors import Collector, MultiAsyncCollector

from daskcollect import DaskCollector

warnings.filterwarnings("ignore")


def fps_after_first(collector, seconds: float) -> float:
    """Frames/s over ``seconds`` of batches after the first one; shuts the collector down."""
    try:
        it = iter(collector)
        next(it)
        frames, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            frames += next(it).numel()
        return frames / (time.perf_counter() - start)
    finally:
        collector.shutdown()


def run(side: str, n: int, step: float, fpb: int, seconds: float) -> float:
    make = SleepEnvMaker(step)
    if side == "single":
        return fps_after_first(Collector(make(), None, frames_per_batch=fpb, total_frames=-1), seconds)
    if side == "torchrl-async":
        return fps_after_first(
            MultiAsyncCollector([make] * n, None, frames_per_batch=fpb, total_frames=-1), seconds
        )
    collector = DaskCollector(make, None, frames_per_batch=fpb, total_frames=-1, num_collectors=n, sync=False)
    return fps_after_first(collector, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--step", type=float, default=0.01, help="seconds each env step sleeps")
    parser.add_argument("--frames-per-batch", type=int, default=50, help="per collector")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per run")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    raw: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.pairs):
        for n in args.workers:
            for side in ("dask-async", "torchrl-async", "single"):
                fps = run(side, n, args.step, args.frames_per_batch, args.seconds)
                raw.setdefault(str(n), {}).setdefault(side, []).append(fps)
                print(f"N={n:2d} {side:14s} {fps:8.0f} frames/s", flush=True)
    summary = {}
    for n, sides in raw.items():
        ideal = [int(n) * s for s in sides["single"]]
        summary[n] = {
            "ideal_fps": statistics.median(ideal),
            **{f"{side}_fps": statistics.median(sides[side]) for side in ("dask-async", "torchrl-async")},
            **{
                f"{side}/ideal": statistics.median(x / y for x, y in zip(sides[side], ideal))
                for side in ("dask-async", "torchrl-async")
            },  # fmt: skip
        }
    save({**header("P2-scaling", args), "raw_fps": raw, "summary": summary}, "scaling", args.out)
    print(f"{'N':>3} {'ideal':>8} {'dask':>8} {'torchrl':>8} {'dask/ideal':>10} {'torchrl/ideal':>13}")
    for n, r in summary.items():
        print(f"{n:>3} {r['ideal_fps']:8.0f} {r['dask-async_fps']:8.0f} {r['torchrl-async_fps']:8.0f} "
              f"{r['dask-async/ideal']:10.3f} {r['torchrl-async/ideal']:13.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
