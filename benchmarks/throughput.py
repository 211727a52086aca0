"""P1: CPU throughput of DaskCollector against TorchRL's own collectors.

The sides run interleaved (A B A B ...) in one process, on the same machine,
and the report is the median ratio over the pairs, since absolute times drift
on shared machines. The first batch of every run is excluded from timing.

    python benchmarks/throughput.py --env CartPole-v1 --workers 2 --pairs 7
    python benchmarks/throughput.py --against ray      # P5: TorchRL's RayCollector instead
    python benchmarks/throughput.py --num-envs 8 --frames-per-batch 800 --total-frames 16800  # P8

P8 (``--num-envs`` above 1) gives every collector gymnasium's vector env
(``GymEnv(env, num_envs=...)``: an ``AsyncVectorEnv``, one process per env, one
batch row per env), and adds the physical limit: the same vector env stepped
with the same policy in a plain loop (gymnasium and the policy's module, no
TorchRL), in this process, times the workers.

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
from makers import ArgmaxPolicy
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import GymEnv

from daskcollect import DaskCollector

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
    """A picklable env constructor (gymnasium's vector env with ``num_envs`` above 1)."""

    def __init__(self, name: str, num_envs: int = 1):
        self.name, self.num_envs = name, num_envs

    def __call__(self):
        return GymEnv(self.name, num_envs=self.num_envs) if self.num_envs > 1 else GymEnv(self.name)


def loop_fps(env: str, num_envs: int, policy, frames: int) -> float:
    """Frames/s of the vector env stepped with the policy's module in a plain loop (the physical limit)."""
    from functools import partial

    import gymnasium as gym

    vec = gym.vector.AsyncVectorEnv([partial(gym.make, env)] * num_envs)  # what GymEnv(num_envs=...) builds
    module = policy.module
    obs, _ = vec.reset(seed=0)
    steps = max(frames // num_envs, 1)
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(steps):
            action = module(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()
            obs, *_ = vec.step(action)
        elapsed = time.perf_counter() - start
    vec.close()
    return steps * num_envs / elapsed


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


def run_side(side: str, env: str, workers: int, fpb: int, total: int, num_envs: int = 1) -> float:
    make = EnvMaker(env, num_envs)
    policy = make_policy(env)
    if side == "loop":
        return loop_fps(env, num_envs, policy, total // workers) * workers
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
    parser.add_argument(
        "--num-envs", type=int, default=1, help="P8: envs per collector (gymnasium's vector env)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    pairs = [("dask-sync", f"{args.against}-sync"), ("dask-async", f"{args.against}-async")]
    raw: dict[str, list[float]] = {}
    for _ in range(args.pairs):
        for a, b in pairs:
            for side in (a, b):
                fps = run_side(
                    side, args.env, args.workers, args.frames_per_batch, args.total_frames, args.num_envs
                )
                raw.setdefault(side, []).append(fps)
                print(f"{side:14s} {fps:9.0f} frames/s", flush=True)
        for side in ("single", "loop") if args.num_envs > 1 else ("single",):
            fps = run_side(
                side, args.env, args.workers, args.frames_per_batch, args.total_frames, args.num_envs
            )
            raw.setdefault(side, []).append(fps)
            print(f"{'N x ' + side:14s} {fps:9.0f} frames/s", flush=True)

    ratios = {f"{a}/{b}": median_ratio(raw[a], raw[b]) for a, b in pairs}
    for a, _ in pairs:
        ratios[f"{a}/limit"] = median_ratio(raw[a], raw["single"])
        if "loop" in raw:
            ratios[f"{a}/limit-loop"] = median_ratio(raw[a], raw["loop"])
    for side in ("torchrl-sync", "torchrl-async"):
        if "loop" in raw and side in raw:
            ratios[f"{side}/limit-loop"] = median_ratio(raw[side], raw["loop"])
    p8 = args.num_envs > 1
    result = {
        **header("P8-vector-envs" if p8 else "P1-throughput", args),
        "raw_fps": raw,
        "median_ratios": ratios,
    }
    suffix = ("" if args.against == "torchrl" else f"-{args.against}") + (
        f"-{args.num_envs}envs" if p8 else ""
    )
    save(result, f"throughput-{args.env}-{args.workers}w{suffix}", args.out)
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
