"""Learning curves: the PPO, DQN and IPPO examples on DaskCollector and on TorchRL's collectors, 3 seeds.

    python benchmarks/learning_curves.py            # runs everything (about 50 min on 2 cores)
    python benchmarks/learning_curves.py --examples ippo   # one example (its old lines are kept)
    python benchmarks/learning_curves.py --report   # only redraws docs/img/training.png and the table

Runs are interleaved (dask, torchrl, dask, ...) so that both sides see the
same machine. Each run appends one JSON line per iteration (PPO) or evaluation
(DQN) to benchmarks/results/training/<example>.jsonl, and a summary line to
runs.jsonl. The report plots return against frames and writes the table of
frames and wall time to reach the target into docs/training.md, between the
``<!-- curves -->`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "benchmarks", "results", "training")
DOC = os.path.join(ROOT, "docs", "training.md")
PNG = os.path.join(ROOT, "docs", "img", "training.png")
EXAMPLES = {"ppo": "ppo_cartpole.py", "dqn": "dqn_cartpole.py", "ippo": "ippo_vmas.py"}
# What each example's curve shows, and the return it stops at.
TITLES = {"ppo": "PPO CartPole-v1", "dqn": "DQN CartPole-v1", "ippo": "IPPO VMAS navigation, 3 agents"}
YLABELS = {"ppo": "mean return, last 20 episodes", "dqn": "greedy mean return, 5 episodes",
           "ippo": "mean agent return, episodes in the batch"}  # fmt: skip
TARGETS = {"ppo": 475.0, "dqn": 475.0, "ippo": 2.0}
SOLVED = re.compile(r"solved: .* after (\d+) frames, (\d+)s")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
parser.add_argument("--report", action="store_true", help="only redraw the plot and the table")
parser.add_argument("--timeout", type=float, default=1200, help="seconds per run")


def run_all(args) -> None:
    os.makedirs(OUT, exist_ok=True)
    for name in args.examples:
        for seed in args.seeds:
            for collector in ("dask", "torchrl"):
                log = os.path.join(OUT, f"{name}.jsonl")
                cmd = [sys.executable, os.path.join(ROOT, "examples", EXAMPLES[name]),
                       "--collector", collector, "--seed", str(seed), "--log", log]  # fmt: skip
                print(" ".join(cmd[1:]), flush=True)
                start = time.monotonic()
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                match = SOLVED.search(out.stdout)
                summary = {
                    "example": name, "collector": collector, "seed": seed,
                    "frames_to_target": int(match.group(1)) if match else None,
                    "seconds": round(time.monotonic() - start, 1), "returncode": out.returncode,
                    "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "cores": os.cpu_count(),
                }  # fmt: skip
                print("  ", summary, flush=True)
                with open(os.path.join(OUT, "runs.jsonl"), "a") as f:
                    f.write(json.dumps(summary) + "\n")


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in EXAMPLES if os.path.exists(os.path.join(OUT, f"{n}.jsonl"))]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    colors = {"dask": "tab:blue", "torchrl": "tab:orange"}
    for ax, name in zip(axes[0], names):
        curves = defaultdict(list)
        for rec in load(os.path.join(OUT, f"{name}.jsonl")):
            curves[(rec["collector"], rec["seed"])].append((rec["frames"], rec["mean_return"]))
        for (collector, seed), points in sorted(curves.items()):
            xs, ys = zip(*points)
            ax.plot(xs, ys, color=colors[collector], alpha=0.8, lw=1.2,
                    label=collector if seed == min(s for c, s in curves if c == collector) else None)  # fmt: skip
        ax.axhline(TARGETS[name], color="gray", ls="--", lw=0.8)
        ax.set(title=TITLES[name], xlabel="frames", ylabel=YLABELS[name])
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(PNG), exist_ok=True)
    fig.savefig(PNG, dpi=110)

    rows = [
        "| example | collector | seed | target | frames to target | wall time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for run in load(os.path.join(OUT, "runs.jsonl")):
        frames = run["frames_to_target"]
        rows.append(f"| {run['example']} | {run['collector']} | {run['seed']} | {TARGETS[run['example']]:g} | "
                    f"{frames if frames is not None else 'not reached'} | {run['seconds']} |")  # fmt: skip
    table = "\n".join(rows)
    with open(DOC) as f:
        doc = f.read()
    start, end = "<!-- curves -->", "<!-- /curves -->"
    doc = doc[: doc.index(start) + len(start)] + "\n" + table + "\n" + doc[doc.index(end) :]
    with open(DOC, "w") as f:
        f.write(doc)
    print(table)


if __name__ == "__main__":
    args = parser.parse_args()
    if not args.report:
        run_all(args)
    report()
