"""P1: CPU throughput of DaskCollector against TorchRL's own collectors.

The sides run interleaved (A B A B ...) in one process, on the same machine,
and the report is the median ratio over the pairs, since absolute times drift
on shared machines. The first batch of every run is excluded from timing.

    python benchmarks/throughput.py --env CartPole-v1 --workers 2 --pairs 7
    python benchmarks/throughput.py --against ray      # P5: TorchRL's RayCollector instead

Ray (the ``bench`` extra) runs a local Ray instance on 127.0.0.1 with as many
CPUs as workers.

Writes a JSON file under benchmarks/results/ and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
from _common import header, median_ratio, save
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
    if side in ("ray-sync", "ray-async"):
        from torchrl.collectors.distributed import RayCollector

        ray_init = {"num_cpus": workers, "include_dashboard": False, "_node_ip_address": "127.0.0.1"}
        c = RayCollector([make] * workers, policy, frames_per_batch=fpb, total_frames=total,
                         num_collectors=workers, sync=side == "ray-sync", ray_init_config=ray_init)  # fmt: skip
        return timed(c, c.shutdown)
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
    parser.add_argument("--against", choices=["torchrl", "ray"], default="torchrl")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    pairs = [("dask-sync", f"{args.against}-sync"), ("dask-async", f"{args.against}-async")]
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

    ratios = {f"{a}/{b}": median_ratio(raw[a], raw[b]) for a, b in pairs}
    for a, _ in pairs:
        ratios[f"{a}/limit"] = median_ratio(raw[a], raw["single"])
    result = {**header("P1-throughput", args), "raw_fps": raw, "median_ratios": ratios}
    suffix = "" if args.against == "torchrl" else f"-{args.against}"
    save(result, f"throughput-{args.env}-{args.workers}w{suffix}", args.out)
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
