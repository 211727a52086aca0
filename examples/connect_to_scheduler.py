"""Collect on a cluster started by hand: `dask scheduler` and `dask worker`.

In three terminals (loopback here; use your hosts' addresses on a real cluster):

    dask scheduler --host 127.0.0.1 --port 8786
    DASK_DISTRIBUTED__WORKER__DAEMON=False dask worker tcp://127.0.0.1:8786 --nthreads 1 --nworkers 2
    python examples/connect_to_scheduler.py tcp://127.0.0.1:8786

One thread per worker process: each worker hosts one collector, and a
collector's rollouts run on the worker's single actor thread. The daemon
setting lets collectors with several envs start their sub-processes.
The env constructor below is a lambda in __main__: it reaches workers that
never saw this file, through cloudpickle.
"""

from __future__ import annotations

import sys

from torchrl.envs import GymEnv

from daskcollect import DaskCollector

if __name__ == "__main__":
    address = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:8786"
    env_name = "CartPole-v1"
    with DaskCollector(
        lambda: GymEnv(env_name),
        frames_per_batch=1000,
        total_frames=20_000,
        client=address,  # or client=Client(address), or scheduler_file="scheduler.json"
    ) as collector:
        print(f"{collector.num_collectors} collectors on {collector.workers}")
        frames = 0
        for batch in collector:
            frames += batch.numel()
        print("collected", frames, "frames")
    # Our actors and plugin are gone; the scheduler and workers keep running.
