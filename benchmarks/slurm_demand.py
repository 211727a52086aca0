"""Jobs that follow the learner: a SLURMCluster under ``adapt()`` while the learner's pace changes 4x.

    tools/slurm.sh start
    python benchmarks/slurm_demand.py --out benchmarks/results/slurm_demand.json --png docs/img/slurm_demand.png

Each collector makes about 90 frames/s (CartPole whose step sleeps 10 ms).
The learner holds each 100-frame batch for ``--slow`` seconds, then for a
quarter of that, then ``--slow`` again. daskcollect tells Dask's ``Adaptive``
how many collectors keep the learner fed (``stats()["wanted_collectors"]``);
dask-jobqueue's ``adapt(minimum_jobs, maximum_jobs)`` submits and retires jobs.
Once a second it records the SLURM jobs running, the live collectors, the
collectors wanted and the learner's pace. Reports how long the jobs took to
follow each change, and the audit: frames, lost rollouts, rollouts twice.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import dask
from _common import header, save
from dask_jobqueue import SLURMCluster
from distributed import Client
from makers import SleepEnvMaker

from daskcollect import DaskCollector

FRAMES = 100


def running_jobs() -> int:
    out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return len(out.stdout.split())


def run(args: argparse.Namespace) -> dict:
    phases = [(args.slow, args.phase), (args.slow / 4, args.phase), (args.slow, args.phase)]
    cluster = SLURMCluster(
        cores=1, processes=1, memory="1GB", walltime="00:30:00", interface="lo",
        log_directory=tempfile.mkdtemp(), python=f"exec {sys.executable}",
        worker_extra_args=["--resources", "collector=1"],
    )  # fmt: skip
    cluster.adapt(minimum_jobs=1, maximum_jobs=args.max_jobs, interval="1s", wait_count=3)
    timeline, pairs, frames = [], set(), 0
    with Client(cluster) as client, dask.config.set({"daskcollect.restart-delay": "0.2s"}):
        client.wait_for_workers(1, timeout=60)
        with DaskCollector(
            SleepEnvMaker(0.01), frames_per_batch=FRAMES, total_frames=-1, num_collectors="auto",
            worker_resources={"collector": 1}, client=client, py_modules=["makers"],
        ) as collector:  # fmt: skip
            start = next_sample = time.monotonic()
            for phase, (hold, seconds) in enumerate(phases):
                end = time.monotonic() + seconds
                for batch in collector:
                    pairs.add(
                        (int(batch["collector", "collector_id"][0]), int(batch["collector", "rollout_id"][0]))
                    )
                    frames += batch.numel()
                    time.sleep(hold)  # the learner's work on this batch
                    now = time.monotonic()
                    if now >= next_sample:
                        stats = collector.stats()
                        timeline.append({
                            "t": round(now - start, 1), "phase": phase, "learner_fps_target": FRAMES / hold,
                            "learner_fps": stats["learner_fps"], "wanted": stats["wanted_collectors"],
                            "live": stats["live_collectors"], "jobs": running_jobs(),
                        })  # fmt: skip
                        next_sample = now + 1.0
                    if now >= end:
                        break
            stats = collector.stats()
    cluster.close()
    return {"timeline": timeline, "frames": frames, "rollouts": len(pairs), "stats_frames": stats["frames"],
            "rollouts_lost": stats["rollouts_lost"], "restarts": stats["restarts"], "retired": stats["retired"],
            "phases": phases, "max_jobs": args.max_jobs}  # fmt: skip


def follow_times(result: dict) -> list[float | None]:
    """Seconds from each change of pace until the running jobs reach that phase's wanted count."""
    out = []
    timeline = result["timeline"]
    for phase in (1, 2):
        rows = [r for r in timeline if r["phase"] == phase]
        if not rows:
            out.append(None)
            continue
        t0, goal = rows[0]["t"], rows[-1]["wanted"]
        reached = next((r["t"] for r in rows if r["jobs"] == goal), None)
        out.append(None if reached is None else round(reached - t0, 1))
    return out


def plot(result: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["timeline"]
    t = [r["t"] for r in rows]
    fig, left = plt.subplots(figsize=(8, 3.5))
    left.step(t, [r["jobs"] for r in rows], where="post", label="SLURM jobs running")
    left.step(t, [r["wanted"] or 0 for r in rows], where="post", linestyle="--", label="collectors wanted")
    left.set_xlabel("seconds")
    left.set_ylabel("jobs / collectors")
    right = left.twinx()
    right.plot(
        t, [r["learner_fps_target"] for r in rows], color="grey", alpha=0.6, label="learner's pace (frames/s)"
    )
    right.set_ylabel("frames/s")
    left.legend(loc="upper left", fontsize=8)
    right.legend(loc="upper right", fontsize=8)
    left.set_title(
        f"adapt(minimum_jobs=1, maximum_jobs={result['max_jobs']}): jobs follow the learner's pace"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--slow", type=float, default=1.0, help="seconds the learner holds a batch, slow phases"
    )
    parser.add_argument("--phase", type=float, default=60.0, help="seconds per phase")
    parser.add_argument("--max-jobs", type=int, default=6)
    parser.add_argument("--out", default=None)
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    result = run(args)
    result["follow_seconds"] = follow_times(result)
    print(json.dumps({k: v for k, v in result.items() if k != "timeline"}, indent=1))
    save({**header("slurm_demand", args), **result}, "slurm_demand", args.out)
    if args.png:
        plot(result, args.png)


if __name__ == "__main__":
    main()
