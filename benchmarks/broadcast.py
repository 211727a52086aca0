"""P3: weight broadcast, against one point-to-point transfer and a one-send-per-worker loop.

On one loopback LocalCluster of max(--workers) worker processes, for each
state-dict size and worker count:

- ``update``: ``update_policy_weights_()`` until every collector has loaded the
  weights: the update, then one sync batch of one frame per collector (each
  call loads the new weights before its step), minus the time of the same
  batch without new weights, taken just before (paired, so that drift cancels;
  where the update costs less than a batch's jitter, about 1 ms here, a
  difference can come out negative). The workers share the driver's host, so the
  weights go through shared memory (the default route there);
- ``update_dask``: the same with ``daskcollect.weights.shared-memory`` off, so
  that the weights go through one Dask scatter replicated between the
  workers: the route to workers on other hosts;
- ``p2p``: one ``scatter`` of the same serialized payload to one worker;
- ``naive``: one ``scatter`` per worker, one after the other (the transfers
  alone: a lower bound for a loop that sends the weights to each collector).

The policy is a one-layer CartPole policy plus an unused parameter that brings
its state dict to the size asked. Medians of --repeats, after --warmup untimed
rounds of each (the first versions create the shared-memory ring's files and
the workers' mappings, which later versions reuse; a training run makes
thousands of updates).

    python benchmarks/broadcast.py --sizes-mb 1 10 100 --workers 2 4 8

Writes benchmarks/results/broadcast.json and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import dask
import torch
from _common import header, save
from distributed import Client, LocalCluster
from makers import BallastPolicy, make_cartpole
from tensordict.nn import TensorDictModule

from daskcollect import DaskCollector
from daskcollect.weights import WeightsPayload, extract_weights

warnings.filterwarnings("ignore")


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def after_warmup(measure_once, repeats: int, warmup: int) -> list[float]:
    """``measure_once()`` over ``warmup + repeats`` calls, the warm-up ones dropped."""
    return [measure_once() for _ in range(warmup + repeats)][warmup:]


def time_update(
    client: Client | str, module: BallastPolicy, policy, n: int, repeats: int, warmup: int, **kwargs
) -> list[float]:
    """Per-repeat seconds of an update until every collector has loaded it (see the docstring);
    ``kwargs`` go to ``DaskCollector``."""
    with DaskCollector(
        make_cartpole, policy, frames_per_batch=n, total_frames=-1, num_collectors=n, sync=True, client=client,
        **kwargs,
    ) as collector:  # fmt: skip
        it = iter(collector)
        next(it)

        def paired() -> float:
            plain = seconds(lambda: next(it))
            with torch.no_grad():
                module.ballast.add_(1.0)
            return seconds(lambda: (collector.update_policy_weights_(), next(it))) - plain

        return after_warmup(paired, repeats, warmup)


def measure(client: Client, n: int, nbytes: int, repeats: int, warmup: int) -> dict[str, float]:
    module = BallastPolicy(nbytes)
    policy = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
    update = time_update(client, module, policy, n, repeats, warmup)
    with dask.config.set({"daskcollect.weights.shared-memory": False}):
        update_dask = time_update(client, module, policy, n, repeats, warmup)
    with DaskCollector(
        make_cartpole, policy, frames_per_batch=n, total_frames=-1, num_collectors=n, sync=True, client=client
    ) as collector:
        ours = collector.client
        payload = WeightsPayload.pack(extract_weights(policy), 0)
        workers = collector.workers

        def scatter_to(addresses):
            for address in addresses:
                future = ours.scatter(payload, workers=[address], direct=True, hash=False, timeout=120)
                future.release()

        p2p = after_warmup(lambda: seconds(lambda: scatter_to(workers[:1])), repeats, warmup)
        naive = after_warmup(lambda: seconds(lambda: scatter_to(workers)), repeats, warmup)
    return {
        "bytes": payload.nbytes,
        "update_s": statistics.median(update),
        "update_dask_s": statistics.median(update_dask),
        "p2p_s": statistics.median(p2p),
        "naive_s": statistics.median(naive),
        "raw_update_s": update,
        "raw_update_dask_s": update_dask,
        "raw_p2p_s": p2p,
        "raw_naive_s": naive,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds before the timed ones")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    rows = []
    with LocalCluster(
        n_workers=max(args.workers), threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    ) as cluster, Client(cluster, set_as_default=False) as client:  # fmt: skip
        for mb in args.sizes_mb:
            for n in args.workers:
                r = {
                    "size_mb": mb,
                    "workers": n,
                    **measure(client, n, int(mb * 1e6), args.repeats, args.warmup),
                }
                r["update/p2p"] = r["update_s"] / r["p2p_s"]
                r["update_dask/p2p"] = r["update_dask_s"] / r["p2p_s"]
                r["naive/p2p"] = r["naive_s"] / r["p2p_s"]
                rows.append(r)
                print(f"{mb:6g} MB  {n} workers  update {1e3 * r['update_s']:8.1f} ms  p2p {1e3 * r['p2p_s']:7.1f} ms"
                      f"  naive {1e3 * r['naive_s']:8.1f} ms  update/p2p {r['update/p2p']:5.2f}"
                      f"  dask route/p2p {r['update_dask/p2p']:5.2f}"
                      f"  naive/p2p {r['naive/p2p']:5.2f}", flush=True)  # fmt: skip
    save({**header("P3-broadcast", args), "rows": rows}, "broadcast", args.out)


if __name__ == "__main__":
    main()
