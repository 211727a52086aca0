"""daskcollect.worker.signals: SIGTERM to a collector's worker process retires it gracefully, anywhere.

SLURM's own signals are in tests/test_slurm.py. Here: a worker process of a
plain cluster (what Kubernetes or a batch system's kill does), the handlers
put back when the collection closes, and a driver that hosts its cluster's
nannies keeping its own handlers.
"""

from __future__ import annotations

import os
import signal

import dask
from distributed import Client
from helpers import wait_until
from makers import SleepEnvMaker

from daskcollect import DaskCollector

FAST = {"daskcollect.restart-delay": "0.2s"}


def handler_name() -> str:
    import signal

    return repr(signal.getsignal(signal.SIGTERM))


def test_sigterm_to_a_worker_process_delivers_its_rollout_and_retires_it(make_cluster):
    here = signal.getsignal(signal.SIGTERM)
    cluster = make_cluster(n_workers=2)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        before = client.run(handler_name)
        pids = client.run(os.getpid)
        with DaskCollector(
            SleepEnvMaker(0.005), frames_per_batch=100, total_frames=-1, num_collectors=2, client=client
        ) as collector:
            assert signal.getsignal(signal.SIGTERM) is here  # the driver hosts the nannies: untouched
            assert client.run(handler_name) != before  # each worker process has daskcollect's
            batches = [b for _, b in zip(range(2), collector)]
            victim = next(iter(pids))
            os.kill(pids[victim], signal.SIGTERM)
            assert wait_until(lambda: batches.append(next(iter(collector))) or collector.stats()["retired"] == 1,
                              timeout=60, interval=0)  # fmt: skip
            stats = collector.stats()
        assert wait_until(lambda: victim not in client.run(os.getpid), timeout=30)
        assert client.run(handler_name) == {a: v for a, v in before.items() if a != victim}  # put back
    assert stats["rollouts_lost"] == 0 and stats["restarts"] == 0
    pairs = [(int(b["collector", "collector_id"][0]), int(b["collector", "rollout_id"][0])) for b in batches]
    assert len(pairs) == len(set(pairs)) and all(b.numel() == 100 for b in batches)


def test_no_handler_is_installed_when_the_setting_is_empty(make_cluster):
    cluster = make_cluster(n_workers=1)
    with (
        Client(cluster, set_as_default=False) as client,
        dask.config.set({"daskcollect.worker.retire-on-signals": []}),
    ):
        before = client.run(handler_name)
        with DaskCollector(SleepEnvMaker(0.0), frames_per_batch=50, total_frames=100, num_collectors=1,
                           client=client) as collector:  # fmt: skip
            assert sum(b.numel() for b in collector) == 100
            assert client.run(handler_name) == before
