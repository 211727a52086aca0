"""PPO interrupted and resumed twice against the same run uninterrupted (the long-runs issue's goal).

    python benchmarks/resume_training.py --seeds 1 --stops 20480 40960

For each seed: ``examples/ppo_cartpole.py`` once straight through, then once
with ``--checkpoint``, stopped after each frame count of ``--stops`` (as a job
whose walltime ran out) and started again on the same checkpoint until it
finishes. CartPole keeps its state inside gymnasium's env, so the resumed
collectors start new episodes at each stop (``restore_envs=False``): the runs
are not value-equal after the first stop, and the goal is the same outcome
(the target return reached, in a comparable number of frames). Results go to
benchmarks/results/resume_training.json.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from _common import header, save

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PPO = os.path.join(ROOT, "examples", "ppo_cartpole.py")
SOLVED = re.compile(r"solved: mean return ([\d.]+) >= \S+ after (\d+) frames")
STOPPED = re.compile(r"stopped after (\d+) frames")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seeds", type=int, nargs="+", default=[1])
parser.add_argument("--stops", type=int, nargs="+", default=[20480, 40960], help="frame counts to stop at")
parser.add_argument("--frames", type=int, default=300_000, help="the frame budget of each run")
parser.add_argument("--timeout", type=float, default=900, help="seconds per process")
parser.add_argument("--out", default=None)


def ppo(seed: int, frames: int, timeout: float, *extra: str) -> tuple[str, float]:
    """One process of the PPO example: its output and wall time."""
    cmd = [sys.executable, PPO, "--seed", str(seed), "--frames", str(frames), *extra]
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout
    return out, time.monotonic() - started


def outcome(output: str) -> dict:
    solved = SOLVED.search(output)
    return {"solved": solved is not None,
            "mean_return": float(solved.group(1)) if solved else None,
            "frames_to_target": int(solved.group(2)) if solved else None}  # fmt: skip


def main(args) -> dict:
    result = {**header("resume_training", args), "runs": []}
    for seed in args.seeds:
        straight, seconds = ppo(seed, args.frames, args.timeout)
        run = {"seed": seed, "uninterrupted": {**outcome(straight), "seconds": round(seconds, 1)}}
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = os.path.join(folder, "ckpt.pt")
            legs, total = [], 0.0
            for stop in [*args.stops, None]:
                extra = ["--checkpoint", checkpoint] + ([] if stop is None else ["--stop-after", str(stop)])
                out, seconds = ppo(seed, args.frames, args.timeout, *extra)
                total += seconds
                stopped = STOPPED.search(out)
                legs.append(
                    {"stopped_at": int(stopped.group(1)) if stopped else None, "seconds": round(seconds, 1)}
                )
                if not stopped:
                    break
            run["resumed"] = {**outcome(out), "legs": legs, "seconds": round(total, 1)}
        result["runs"].append(run)
        print(run, flush=True)
    save(result, "resume_training", args.out)
    return result


if __name__ == "__main__":
    main(parser.parse_args())
