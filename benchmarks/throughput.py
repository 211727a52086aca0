"""P1: CPU throughput of DaskCollector against TorchRL's own collectors.

The sides run interleaved (A B A B ...) in one process, on the same machine,
and the report is the median ratio over the pairs, since absolute times drift
on shared machines. The first batch of every run is excluded from timing.

    python benchmarks/throughput.py --env CartPole-v1 --workers 2 --pairs 3

Writes a JSON file under benchmarks/results/ and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
import warnings

import dask
import distributed
import tensordict
import torch
import torchrl
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import GymEnv

from daskcollect import DaskCollector
from daskcollect.testing import ArgmaxPolicy

warnings.filterwarnings("ignore")


def make_policy(env_name: str):
    """A small MLP policy for the env."""
    from tensordict.nn import TensorDictModule

    env = GymEnv(env_name)
    n_obs = env.observation_spec["observation"].shape[-1]
    if env_name.startswith("CartPole"):
        return TensorDictModule(ArgmaxPolicy(n_obs, 2), ["observation"], ["action"])
    n_act = env.action_spec.shape[-1]
    mlp = torch.nn.Sequential(torch.nn.Linear(n_obs, 64), torch.nn.Tanh(), torch.nn.Linear(64, n_act))
    return TensorDictModule(mlp, ["observation"], ["action"])


class EnvMaker:
    """A picklable env constructor."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self):
        return GymEnv(self.name)


def timed(collector, close) -> float:
    """Frames per second over all batches but the first."""
    try:
        it = iter(collector)
        next(it)
        frames, start = 0, time.perf_counter()
        for batch in it:
            frames += batch.numel()
        return frames / (time.perf_counter() - start)
    finally:
        close()


def run_side(side: str, env: str, workers: int, fpb: int, total: int) -> float:
    make = EnvMaker(env)
    policy = make_policy(env)
    if side == "single":
        c = Collector(make(), policy, frames_per_batch=fpb, total_frames=total // workers)
        return timed(c, c.shutdown) * workers
    if side in ("torchrl-sync", "torchrl-async"):
        cls = MultiSyncCollector if side == "torchrl-sync" else MultiAsyncCollector
        c = cls([make] * workers, policy, frames_per_batch=fpb, total_frames=total)
        return timed(c, c.shutdown)
    c = DaskCollector(
        make,
        policy,
        frames_per_batch=fpb,
        total_frames=total,
        num_collectors=workers,
        sync=side == "dask-sync",
    )
    return timed(c, c.shutdown)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--frames-per-batch", type=int, default=1000)
    parser.add_argument("--total-frames", type=int, default=21000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    pairs = [("dask-sync", "torchrl-sync"), ("dask-async", "torchrl-async")]
    raw: dict[str, list[float]] = {}
    for _ in range(args.pairs):
        for a, b in pairs:
            for side in (a, b):
                fps = run_side(side, args.env, args.workers, args.frames_per_batch, args.total_frames)
                raw.setdefault(side, []).append(fps)
                print(f"{side:14s} {fps:9.0f} frames/s", flush=True)
        fps = run_side("single", args.env, args.workers, args.frames_per_batch, args.total_frames)
        raw.setdefault("single", []).append(fps)
        print(f"{'N x single':14s} {fps:9.0f} frames/s", flush=True)

    ratios = {f"{a}/{b}": statistics.median(x / y for x, y in zip(raw[a], raw[b])) for a, b in pairs}
    for a, _ in pairs:
        ratios[f"{a}/limit"] = statistics.median(x / y for x, y in zip(raw[a], raw["single"]))
    result = {
        "benchmark": "P1-throughput",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": platform.node(),
        "cores": os.cpu_count(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "dask": dask.__version__,
            "distributed": distributed.__version__,
        },
        "args": vars(args),
        "raw_fps": raw,
        "median_ratios": ratios,
    }
    out = args.out or os.path.join(
        os.path.dirname(__file__), "results", f"throughput-{args.env}-{args.workers}w.json"
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
