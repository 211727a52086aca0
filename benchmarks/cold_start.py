"""P9: the first minute of a new user, from a cold interpreter: --help, imports, a private cluster.

Each figure is the median of --repeats fresh processes (nothing warm but the
OS page cache):

- ``help``: ``daskcollect run --help``;
- ``import daskcollect`` and ``import torchrl.collectors`` (what a collector
  cannot avoid: the floor under the next rows);
- ``DaskCollector()``, then its first batch, with no cluster given (a private
  LocalCluster of --workers processes, their torch and TorchRL imports
  included), against ``MultiSyncCollector``'s construction and first batch
  (its own processes), same env, policy and batch;
- the CLI's run of --frames frames: wall time, and the start-up and collection
  times it prints.

    python benchmarks/cold_start.py --repeats 3

Writes benchmarks/results/cold_start.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from _common import header, save

BIN = os.path.dirname(sys.executable)

FIRST_BATCH = """
import json, os, sys, time
t0 = time.perf_counter()
from makers import cartpole_policy, make_cartpole
if __name__ == "__main__":  # MultiSyncCollector's spawned processes import this file again
    kind, n = sys.argv[1], int(sys.argv[2])
    if kind == "dask":
        from daskcollect import DaskCollector
        t1 = time.perf_counter()
        c = DaskCollector(make_cartpole, cartpole_policy(), frames_per_batch=100 * n, total_frames=-1,
                          num_collectors=n, sync=True)
    else:
        from torchrl.collectors import MultiSyncCollector
        t1 = time.perf_counter()
        c = MultiSyncCollector([make_cartpole] * n, cartpole_policy(), frames_per_batch=100 * n, total_frames=-1)
    t2 = time.perf_counter()
    next(iter(c))
    t3 = time.perf_counter()
    c.shutdown()
    t4 = time.perf_counter()
    with open(sys.argv[3], "w") as f:
        json.dump({"imports_s": t1 - t0, "construct_s": t2 - t1, "first_batch_s": t3 - t2,
                   "to_first_batch_s": t3 - t0, "shutdown_s": t4 - t3}, f)
    # Both kinds leave at once: after MultiSyncCollector's shutdown the interpreter's exit
    # can wait on its helper processes for minutes here, which is not start-up.
    os._exit(0)
"""


def wall(cmd: list[str], folder: str) -> tuple[float, str]:
    """Seconds until ``cmd`` exits, and its stdout (through a file: a process left behind by
    ``MultiSyncCollector`` keeps a pipe open long after the command has exited)."""
    path = os.path.join(folder, "stdout.txt")
    with open(path, "w") as out:
        start = time.perf_counter()
        subprocess.run(cmd, stdout=out, stderr=subprocess.DEVNULL, timeout=300, check=True)
        seconds = time.perf_counter() - start
    with open(path) as f:
        return seconds, f.read()


def first_batch(kind: str, n: int, folder: str) -> dict[str, float]:
    script = os.path.join(folder, "first_batch.py")
    with open(script, "w") as f:
        f.write(FIRST_BATCH)
    result = os.path.join(folder, "result.json")
    seconds, _ = wall([sys.executable, script, kind, str(n), result], folder)
    with open(result) as f:
        return {**json.load(f), "process_s": seconds}


def cli_run(n: int, frames: int, folder: str) -> dict[str, float]:
    seconds, out = wall([os.path.join(BIN, "daskcollect"), "run", "--env", "CartPole-v1", "--collectors", str(n),
                         "--frames", str(frames), "--no-progress"], folder)  # fmt: skip
    rows = dict(re.findall(r"^(start-up \(s\)|collection \(s\))\s+([\d.]+)$", out, re.M))
    return {
        "wall_s": seconds,
        "startup_s": float(rows["start-up (s)"]),
        "collection_s": float(rows["collection (s)"]),
    }


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--frames", type=int, default=20_000, help="frames of the CLI run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    raw: dict[str, list] = {
        k: [] for k in ("help", "import_daskcollect", "import_torchrl", "dask", "torchrl", "cli")
    }
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):  # interleaved, so that drift spreads over every row
            raw["help"].append(wall([os.path.join(BIN, "daskcollect"), "run", "--help"], folder)[0])
            raw["import_daskcollect"].append(wall([sys.executable, "-c", "import daskcollect"], folder)[0])
            raw["import_torchrl"].append(wall([sys.executable, "-c", "import torchrl.collectors"], folder)[0])
            raw["dask"].append(first_batch("dask", args.workers, folder))
            raw["torchrl"].append(first_batch("torchrl", args.workers, folder))
            raw["cli"].append(cli_run(args.workers, args.frames, folder))
    summary = {
        "help_s": statistics.median(raw["help"]),
        "import_daskcollect_s": statistics.median(raw["import_daskcollect"]),
        "import_torchrl_s": statistics.median(raw["import_torchrl"]),
        "dask": medians(raw["dask"]),
        "torchrl": medians(raw["torchrl"]),
        "cli": medians(raw["cli"]),
    }
    summary["dask/torchrl to first batch"] = (
        summary["dask"]["to_first_batch_s"] / summary["torchrl"]["to_first_batch_s"]
    )
    save({**header("P9-cold-start", args), "raw": raw, "summary": summary}, "cold_start", args.out)
    print(f"daskcollect run --help       {summary['help_s']:6.2f} s")
    print(f"import daskcollect           {summary['import_daskcollect_s']:6.2f} s")
    print(f"import torchrl.collectors    {summary['import_torchrl_s']:6.2f} s")
    for kind in ("dask", "torchrl"):
        s = summary[kind]
        print(f"{kind:8s} imports {s['imports_s']:5.2f}  construct {s['construct_s']:5.2f}  first batch "
              f"{s['first_batch_s']:5.2f}  = {s['to_first_batch_s']:5.2f} s  (shutdown {s['shutdown_s']:4.2f})")  # fmt: skip
    c = summary["cli"]
    print(f"CLI {args.frames} frames: wall {c['wall_s']:5.2f} s, start-up {c['startup_s']:5.2f}, "
          f"collection {c['collection_s']:5.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
