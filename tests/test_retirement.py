"""daskcollect.retirement: workers that retire themselves (--lifetime) with a restart come back."""

from __future__ import annotations

import asyncio
import contextlib

from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin
from helpers import wait_until

from daskcollect.retirement import install_retirement_hook


class SlowRemoval(SchedulerPlugin):
    """A scheduler slow to finish removing a worker, as a loaded one is: heartbeats arrive meanwhile."""

    name = "test-slow-removal"

    async def remove_worker(self, scheduler, worker, *, stimulus_id, **kwargs):
        with contextlib.suppress(asyncio.CancelledError):  # the cluster closing
            await asyncio.sleep(2)


def worker_lives(make_cluster, hook: bool, wanted: int, seconds: float) -> tuple[set[str], int]:
    """Runs a 1-worker cluster with lifetime="3s" and restart; returns the workers seen and the count at the end."""
    cluster = make_cluster(n_workers=1, lifetime="3s", lifetime_stagger="0s", lifetime_restart=True)
    with Client(cluster, set_as_default=False) as client:
        client.register_plugin(SlowRemoval())
        if hook:
            assert install_retirement_hook(client, timeout=10)
        seen: set[str] = set()

        def seen_enough() -> bool:
            seen.update(cluster.scheduler.workers)
            return len(seen) >= wanted

        wait_until(seen_enough, timeout=seconds)
        return seen, len(cluster.scheduler.workers)


def test_a_lifetime_restart_worker_comes_back_every_time_under_a_slow_scheduler(make_cluster):
    seen, _ = worker_lives(make_cluster, hook=True, wanted=3, seconds=45)
    assert len(seen) >= 3, f"the worker came back {len(seen) - 1} times in 45 s, not twice: {seen}"


def test_without_the_hook_dask_loses_the_worker_at_its_first_retirement(make_cluster):
    """The race the hook avoids is real here (if Dask fixes dask/distributed#4752, the hook's change can go)."""
    seen, left = worker_lives(make_cluster, hook=False, wanted=2, seconds=15)
    assert len(seen) == 1 and left == 0, f"Dask itself brought the worker back: {seen}"
