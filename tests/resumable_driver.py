"""A training driver that checkpoints after every batch, run as its own process so a test can kill it.

    python resumable_driver.py ADDRESS FOLDER sync|async restore|reset [reattach]

Each batch goes to ``FOLDER/batch-NNNN.pt``, then a checkpoint (the collector's
state and how many batches it covers) replaces ``FOLDER/checkpoint.pt``. A
driver started again on the same folder drops batches the checkpoint does
not cover, loads it and goes on; at the end it writes ``FOLDER/done``.

With ``reattach``, the envs are :func:`makers.make_counted_pendulum`'s and the
checkpoint goes to ``DaskCollector(resume_from=...)``, which takes over the
killed driver's collectors where the grace period
(``DASK_DASKCOLLECT__REATTACH__GRACE_PERIOD``) allows; the indices taken over
go to ``FOLDER/reattached.txt``.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from makers import make_counted_pendulum, make_stateless_pendulum, pendulum_policy

from daskcollect import DaskCollector

FRAMES_PER_BATCH = 40
TOTAL_FRAMES = 40 * 150


def main(address: str, folder: str, mode: str, envs: str, how: str = "load") -> None:
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
    reattach, restore = how == "reattach", envs == "restore"
    resume = {"resume_from": saved["collector"], "restore_envs": restore} if saved and reattach else {}
    with DaskCollector(
        make_counted_pendulum if reattach else make_stateless_pendulum, pendulum_policy(),
        frames_per_batch=FRAMES_PER_BATCH, total_frames=TOTAL_FRAMES, sync=mode == "sync", seed=11,
        max_frames_per_traj=25, num_collectors=2, client=address, **resume,
    ) as collector:  # fmt: skip
        if saved and not reattach:
            collector.load_state_dict(saved["collector"], restore_envs=restore)
        with open(os.path.join(folder, "reattached.txt"), "w") as f:
            f.write(repr(collector.stats()["reattached"]))
        for i, batch in enumerate(collector, start=covered):
            if i == covered and saved:
                with open(os.path.join(folder, "resumed_in.txt"), "w") as f:
                    f.write(str(time.monotonic() - started))  # construction, load and first batch
            torch.save(batch, os.path.join(folder, f"batch-{i:04d}.pt"))
            torch.save({"collector": collector.state_dict(), "batches": i + 1}, path + ".tmp")
            os.replace(path + ".tmp", path)
    open(os.path.join(folder, "done"), "w").close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
