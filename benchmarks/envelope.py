"""The scale envelope: how many batches per second one driver sustains.

Each collector is a ``PrebuiltCollector`` (``tests/makers.py``): it returns the
same batch (--frames-per-batch CartPole frames) at once, every time, so what
is measured is the path around a rollout: the actor call, the transfer, the
driver's bookkeeping. Async mode. Three sides, interleaved for each collector
count:

- ``dask``: a ``dask scheduler`` and ``dask worker`` processes started here on
  loopback (as in ``driver_cost.py --external``), so the driver process holds
  only the client;
- ``dask-hosts`` (with ``--hosts H``, needs root and iproute2): the scheduler and
  the workers on H simulated hosts (``tests/netns.py``: Linux network
  namespaces on one bridge, unshaped links), the workers spread evenly, so every
  batch crosses a host's link to the driver, as on a real cluster;
- ``torchrl``: ``MultiAsyncCollector`` built with the same ``collector_class``.

Each gives batches/s and the driver's CPU per batch. On the 2-core machine the
workers, the scheduler and the driver share the cores, so the figures are a
floor for a driver with a core of its own.

    python benchmarks/envelope.py --collectors 2 8 16 --hosts 4 --pairs 3

Writes benchmarks/results/envelope.json and prints a table.
"""

from __future__ import annotations

import argparse
import warnings

import dask
from _common import header, medians, save
from distributed import Client
from driver_cost import external_cluster, measure, stop
from makers import PrebuiltCollector, make_cartpole
from netns import SimulatedHosts, unavailable
from torchrl.collectors import MultiAsyncCollector

from daskcollect import DaskCollector

warnings.filterwarnings("ignore")


def dask_collector(n: int, args, address: str) -> DaskCollector:
    return DaskCollector(
        make_cartpole, None, collector_class=PrebuiltCollector, frames_per_batch=args.frames_per_batch,
        total_frames=-1, num_collectors=n, sync=False, client=address,
    )  # fmt: skip


def run_dask(n: int, args) -> dict[str, float]:
    scheduler, workers, address = external_cluster(n)
    try:
        return measure(dask_collector(n, args, address), args.seconds, list)
    finally:
        stop(workers, scheduler)


def run_dask_hosts(n: int, args) -> dict[str, float]:
    hosts = [f"w{i}" for i in range(1, args.hosts + 1)]
    with SimulatedHosts(["sched", *hosts], subnet="10.214.0", bridge="dcbr-env") as rig:
        address = rig.scheduler("sched")
        for i, host in enumerate(hosts):
            share = n // len(hosts) + (i < n % len(hosts))
            if share:
                rig.workers(host, address, share)
        with Client(address, timeout=60) as client:
            client.wait_for_workers(n, timeout=300)
        # The hosts share this machine's /dev/shm: off, nothing takes a same-host route.
        with dask.config.set({"daskcollect.weights.shared-memory": False}):
            collector = dask_collector(n, args, address)
        return measure(collector, args.seconds, list)


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
    parser.add_argument("--hosts", type=int, default=0, help="also on this many simulated hosts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.hosts and unavailable():
        parser.error(f"--hosts needs network namespaces: {unavailable()}")

    raw: dict[str, dict[str, list[dict]]] = {}
    for _ in range(args.pairs):
        for n in args.collectors:
            sides = [("dask", run_dask), ("torchrl", run_torchrl)]
            if args.hosts:
                sides.insert(1, ("dask-hosts", run_dask_hosts))
            for side, run in sides:
                r = run(n, args)
                raw.setdefault(str(n), {}).setdefault(side, []).append(r)
                print(f"N={n:3d} {side:10s} {r['batches_per_s']:8.0f} batches/s  driver "
                      f"{r['driver_ms_per_batch']:.2f} ms/batch", flush=True)  # fmt: skip
    summary = medians(raw, ("batches_per_s", "driver_ms_per_batch"))
    save({**header("envelope", args), "raw": raw, "summary": summary}, "envelope", args.out)
    for n, r in summary.items():
        print(f"N={n:>3}: " + "  ".join(f"{k} {v:.2f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
