"""P10: what the workers' monitoring costs a rollout (episode bookkeeping and the time split).

One TorchRL ``Collector`` on CartPole, in this process, collects the same number
of batches plain (A) and measured as a ``DaskCollector`` worker measures it (B:
the env's steps and the policy's calls timed in place, and each batch's
episodes counted by ``EpisodeTracker``). The sides alternate A B A B, and the
report is the median of the per-pair ratios B / A of the time per batch.

    python benchmarks/probes_overhead.py --pairs 7

Writes benchmarks/results/probes_overhead.json and prints the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from _common import header, median_ratio, save
from makers import cartpole_policy, make_cartpole
from torchrl.collectors import Collector

from daskcollect.monitoring.worker import EpisodeTracker, TimeSplit

warnings.filterwarnings("ignore")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--pairs", type=int, default=7)
parser.add_argument("--batches", type=int, default=40)
parser.add_argument("--frames-per-batch", type=int, default=200)
parser.add_argument("--out", default=None)


def seconds_per_batch(measured: bool, batches: int, frames_per_batch: int) -> float:
    """Time per batch over ``batches`` batches (the first, which builds the carrier, excluded)."""
    torch.manual_seed(0)
    collector = Collector(
        make_cartpole, cartpole_policy(), frames_per_batch=frames_per_batch, total_frames=-1
    )
    split, tracker = TimeSplit(), EpisodeTracker()
    if measured:
        assert split.instrument(collector)
    it = iter(collector)
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        if measured:
            split.start()
        batch = next(it)
        if measured:
            tracker.update(batch)
            split.finish(0.0)
    elapsed = time.perf_counter() - start
    collector.shutdown()
    return elapsed / batches


def main(args) -> dict:
    torch.set_num_threads(1)
    plain, measured = [], []
    for pair in range(args.pairs):
        plain.append(seconds_per_batch(False, args.batches, args.frames_per_batch))
        measured.append(seconds_per_batch(True, args.batches, args.frames_per_batch))
        print(
            f"pair {pair}: plain {1000 * plain[-1]:.2f} ms/batch, measured {1000 * measured[-1]:.2f} ms/batch"
        )
    result = {
        **header("probes_overhead", args),
        "plain_s": plain,
        "measured_s": measured,
        "ratio_median": median_ratio(measured, plain),
        "ratio_pairs": [m / p for m, p in zip(measured, plain)],
        "plain_median_ms": 1000 * statistics.median(plain),
    }
    print(f"measured / plain, median of {args.pairs} pairs: {result['ratio_median']:.3f}")
    save(result, "probes_overhead", args.out)
    return result


if __name__ == "__main__":
    main(parser.parse_args())
