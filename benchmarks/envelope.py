"""The scale envelope: how many batches per second one driver sustains.

Each collector is a ``daskcollect.testing.PrebuiltCollector``: it returns the
same batch (--frames-per-batch CartPole frames) at once, every time, so what
is measured is the path around a rollout: the actor call, the transfer, the
driver's bookkeeping. Async mode, with a ``dask scheduler`` and ``dask worker``
processes started here (as in ``driver_cost.py --external``), so the driver
process holds only the client. For each collector count, interleaved with
TorchRL's ``MultiAsyncCollector`` built with the same ``collector_class``:
batches/s, and the driver's CPU per batch.

On the 2-core machine the workers, the scheduler and the driver share the
cores, so the figures are a floor for a driver with a core of its own.

    python benchmarks/envelope.py --collectors 2 4 8 --pairs 2

Writes benchmarks/results/envelope.json and prints a table.
"""

from __future__ import annotations

import argparse
import warnings

from _common import header, medians, save
from driver_cost import external_cluster, measure, stop
from torchrl.collectors import MultiAsyncCollector

from daskcollect import DaskCollector
from daskcollect.testing import PrebuiltCollector, make_cartpole

warnings.filterwarnings("ignore")


def run_dask(n: int, args) -> dict[str, float]:
    scheduler, workers, address = external_cluster(n)
    try:
        collector = DaskCollector(
            make_cartpole, None, collector_class=PrebuiltCollector, frames_per_batch=args.frames_per_batch,
            total_frames=-1, num_collectors=n, sync=False, client=address,
        )  # fmt: skip
        return measure(collector, args.seconds, list)
    finally:
        stop(workers, scheduler)


def run_torchrl(n: int, args) -> dict[str, float]:
    collector = MultiAsyncCollector(
        [make_cartpole] * n, None, frames_per_batch=args.frames_per_batch, total_frames=-1,
        collector_class=PrebuiltCollector,
    )  # fmt: skip
    return measure(collector, args.seconds, list)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collectors", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--frames-per-batch", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per run")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    raw: dict[str, dict[str, list[dict]]] = {}
    for _ in range(args.pairs):
        for n in args.collectors:
            for side, run in (("dask", run_dask), ("torchrl", run_torchrl)):
                r = run(n, args)
                raw.setdefault(str(n), {}).setdefault(side, []).append(r)
                print(f"N={n:3d} {side:8s} {r['batches_per_s']:8.0f} batches/s  driver "
                      f"{r['driver_ms_per_batch']:.2f} ms/batch", flush=True)  # fmt: skip
    summary = medians(raw, ("batches_per_s", "driver_ms_per_batch"))
    save({**header("envelope", args), "raw": raw, "summary": summary}, "envelope", args.out)
    print(f"{'N':>4} {'dask batches/s':>14} {'torchrl batches/s':>17} {'dask ms/b':>10} {'torchrl ms/b':>12}")
    for n, r in summary.items():
        print(f"{n:>4} {r['dask_batches_per_s']:14.0f} {r['torchrl_batches_per_s']:17.0f} "
              f"{r['dask_driver_ms_per_batch']:10.2f} {r['torchrl_driver_ms_per_batch']:12.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
