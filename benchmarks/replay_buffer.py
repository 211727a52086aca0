"""Replay buffer on the cluster against one on the driver: bytes and CPU through the driver.

The same collection (pixel env, 84x84x3 frames, async, 2 collectors) fills a
TorchRL replay buffer of the same storage twice, interleaved:

- ``local``: ``replay_buffer=ReplayBuffer(...)`` on the driver, so every batch
  travels to the driver and is copied into the buffer there;
- ``cluster``: ``replay_buffer=DaskReplayBuffer(...)`` on a worker, which the
  collectors extend worker to worker.

Reported: payload bytes received by the driver per frame (the batches' tensor
bytes; the cluster side receives only each rollout's small record), the
driver's CPU seconds, and the wall time.

    python benchmarks/replay_buffer.py --frames 4000 --pairs 3
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import psutil
from _common import header, save
from distributed import Client, LocalCluster
from makers import make_pixel_env
from torchrl.data import LazyTensorStorage, ReplayBuffer

from daskcollect import DaskCollector, DaskReplayBuffer

warnings.filterwarnings("ignore")


def run(client: Client, side: str, frames: int, fpb: int) -> dict[str, float]:
    capacity = frames + fpb
    if side == "local":
        rb = ReplayBuffer(storage=LazyTensorStorage(capacity))
    else:
        rb = DaskReplayBuffer(storage=LazyTensorStorage(capacity), client=client)
    received = 0
    try:
        with DaskCollector(make_pixel_env, frames_per_batch=fpb, total_frames=frames, num_collectors=2,
                           replay_buffer=rb, client=client) as collector:  # fmt: skip
            proc = psutil.Process()
            cpu0, wall0 = sum(proc.cpu_times()[:2]), time.perf_counter()
            for _ in collector:
                pass
            wall, cpu = time.perf_counter() - wall0, sum(proc.cpu_times()[:2]) - cpu0
        stored = len(rb)
        if side == "local":  # every frame in it arrived at the driver as a batch
            received = rb[:stored].bytes() if stored else 0
    finally:
        if side == "cluster":
            rb.close()
    return {"wall_s": wall, "driver_cpu_s": cpu, "bytes_per_frame": received / frames, "stored": stored}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=4000)
    parser.add_argument("--frames-per-batch", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    raw: dict[str, list[dict]] = {"local": [], "cluster": []}
    with LocalCluster(n_workers=3, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster:
        with Client(cluster, set_as_default=False) as client:
            for _ in range(args.pairs):
                for side in ("local", "cluster"):
                    raw[side].append(run(client, side, args.frames, args.frames_per_batch))
    summary = {
        side: {
            key: statistics.median(r[key] for r in runs)
            for key in ("wall_s", "driver_cpu_s", "bytes_per_frame")
        }
        for side, runs in raw.items()
    }
    result = {**header("replay-buffer", args), "raw": raw, "median": summary}
    path = save(result, "replay_buffer", args.out)
    for side, m in summary.items():
        print(f"{side:8s} wall {m['wall_s']:.2f} s  driver CPU {m['driver_cpu_s']:.2f} s  "
              f"{m['bytes_per_frame']:,.0f} B/frame through the driver")  # fmt: skip
    print(f"-> {path}")


if __name__ == "__main__":
    main()
