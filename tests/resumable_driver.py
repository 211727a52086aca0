"""A training driver that checkpoints after every batch, run as its own process so a test can kill it.

    python resumable_driver.py ADDRESS FOLDER sync|async restore|reset

Each batch goes to ``FOLDER/batch-NNNN.pt``, then a checkpoint (the collector's
state and how many batches it covers) replaces ``FOLDER/checkpoint.pt``. A
driver started again on the same folder drops batches the checkpoint does
not cover, loads it and goes on; at the end it writes ``FOLDER/done``.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from makers import make_stateless_pendulum, pendulum_policy

from daskcollect import DaskCollector

FRAMES_PER_BATCH = 40
TOTAL_FRAMES = 40 * 150


def main(address: str, folder: str, mode: str, envs: str) -> None:
    path = os.path.join(folder, "checkpoint.pt")
    saved = torch.load(path, weights_only=False) if os.path.exists(path) else None
    covered = saved["batches"] if saved else 0
    dropped = 0
    for name in os.listdir(folder):
        if name.startswith("batch-") and int(name[6:10]) >= covered:
            os.remove(os.path.join(folder, name))  # yielded after the last checkpoint: collected again
            dropped += 1
    if saved:
        # Frames the killed run had made that this one makes again: batches yielded after the
        # checkpoint, and the rollouts that were in flight when it was taken.
        in_flight = len(saved["collector"]["in_flight"]) * (FRAMES_PER_BATCH // (2 if mode == "sync" else 1))
        with open(os.path.join(folder, "recollected.txt"), "w") as f:
            f.write(str(dropped * FRAMES_PER_BATCH + in_flight))
    started = time.monotonic()
    with DaskCollector(
        make_stateless_pendulum, pendulum_policy(), frames_per_batch=FRAMES_PER_BATCH,
        total_frames=TOTAL_FRAMES, sync=mode == "sync", seed=11, max_frames_per_traj=25,
        num_collectors=2, client=address,
    ) as collector:  # fmt: skip
        if saved:
            collector.load_state_dict(saved["collector"], restore_envs=envs == "restore")
        for i, batch in enumerate(collector, start=covered):
            if i == covered and saved:
                with open(os.path.join(folder, "resumed_in.txt"), "w") as f:
                    f.write(str(time.monotonic() - started))  # construction, load and first batch
            torch.save(batch, os.path.join(folder, f"batch-{i:04d}.pt"))
            torch.save({"collector": collector.state_dict(), "batches": i + 1}, path + ".tmp")
            os.replace(path + ".tmp", path)
    open(os.path.join(folder, "done"), "w").close()


if __name__ == "__main__":
    main(*sys.argv[1:5])
