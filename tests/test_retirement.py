"""daskcollect.retirement.driver: graceful retirement of collectors' workers; Dask's own for the other workers.

The scheduler plugin's logic runs in process, on Dask's ``gen_cluster``: a
retirement of a worker without a collector, of one with a collector's actor
(announced, then retired once the actor is released, or refused after the
timeout), a worker retiring itself (removed when it disconnects), and the plugin's
close. The end-to-end test keeps real nannies restarting ``--lifetime`` workers
under a slow scheduler (``tests/test_collection_engine.py`` has collections across
retirements).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Any

from distributed import Client
from distributed.core import rpc
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils_test import gen_cluster
from helpers import wait_until

from daskcollect.collection.polling import apoll_until
from daskcollect.leases.scheduler import acquire, release_lease
from daskcollect.retirement import ACTOR_KEY_PREFIX, RETIREMENT_PLUGIN, RETIRING_TOPIC
from daskcollect.retirement.driver import install_retirement_hook
from daskcollect.retirement.scheduler import GracefulRetirement

TWO_WORKERS = [("127.0.0.1", 1), ("127.0.0.1", 1)]


class Held:
    """An actor whose key carries daskcollect's prefix: to the plugin, a collector."""


def announced(scheduler) -> list[list[str]]:
    return [msg["workers"] for _, msg in scheduler.get_events(RETIRING_TOPIC)]


async def with_plugin(client, timeout: float = 10.0) -> None:
    await client.run_on_scheduler(acquire, GracefulRetirement(timeout), "test-lease", client.id)


@gen_cluster(client=True, nthreads=TWO_WORKERS)
async def test_a_worker_without_collectors_retires_as_with_dask_alone(c, s, a, b):
    await with_plugin(c)
    other = c.submit(Held, actor=True, workers=[b.address], key="users-own-actor")  # not ours
    await other
    retired = await c.retire_workers([a.address])
    assert set(retired) == {a.address} and a.address not in s.workers  # retired and removed at once
    assert announced(s) == []  # nothing to release first
    # A worker holding somebody else's actor: Dask refuses it, as it would without the plugin.
    assert await c.retire_workers([b.address]) == {} and b.address in s.workers
    assert announced(s) == []


@gen_cluster(client=True, nthreads=TWO_WORKERS)
async def test_a_collectors_worker_is_announced_then_retired_once_its_actor_is_released(c, s, a, b):
    await with_plugin(c)
    actor = c.submit(Held, actor=True, workers=[a.address], key=f"{ACTOR_KEY_PREFIX}test-0")
    await actor
    retiring = asyncio.ensure_future(c.retire_workers([a.address]))
    assert await apoll_until(lambda: announced(s), 10)
    (workers,) = announced(s)
    assert workers == [a.address] and not retiring.done()  # it waits for the release
    await c.cancel([actor])
    retired = await asyncio.wait_for(retiring, 10)
    assert set(retired) == {a.address} and set(s.workers) == {b.address}


@gen_cluster(client=True, nthreads=TWO_WORKERS)
async def test_a_collector_not_released_in_time_leaves_its_worker_to_dasks_refusal(c, s, a, b):
    await with_plugin(c, timeout=0.5)
    actor = c.submit(Held, actor=True, workers=[a.address], key=f"{ACTOR_KEY_PREFIX}test-1")
    await actor
    start = time.monotonic()
    assert await c.retire_workers([a.address]) == {}  # refused: it still holds the actor
    assert 0.5 <= time.monotonic() - start < 5
    assert a.address in s.workers and announced(s) == [[a.address]]


async def retire_itself(s, worker) -> None:
    """What ``Worker.close_gracefully`` (``--lifetime``) asks of the scheduler."""
    async with rpc(s.address) as scheduler:
        await scheduler.retire_workers(
            workers=[worker.address],
            close_workers=False,
            remove=True,
            stimulus_id=f"worker-close-gracefully-{time.time()}",
        )


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_collectors_worker_retiring_itself_stays_listed_until_it_disconnects(c, s, a):
    """A heartbeat racing the worker's close then still finds it, and the worker does not close its
    nanny (dask/distributed#4752)."""
    await with_plugin(c)
    actor = c.submit(Held, actor=True, workers=[a.address], key=f"{ACTOR_KEY_PREFIX}test-2")
    await actor
    retiring = asyncio.ensure_future(retire_itself(s, a))
    assert await apoll_until(lambda: announced(s), 10)
    await c.cancel([actor])
    await asyncio.wait_for(retiring, 10)
    assert a.address in s.workers and s.workers[a.address].status.name == "closing_gracefully"
    await a.close()
    assert await apoll_until(lambda: a.address not in s.workers, 10)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_worker_without_collectors_retiring_itself_is_removed_as_by_dask_alone(c, s, a):
    await with_plugin(c)
    await retire_itself(s, a)
    assert a.address not in s.workers and announced(s) == []


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_the_last_lease_out_gives_dasks_handler_back(c, s, a):
    """Two collections lease the plugin: it wraps Dask's handler once, and the last release
    removes it and restores the handler."""
    dasks = s.handlers["retire_workers"]
    first = await c.run_on_scheduler(acquire, GracefulRetirement(10), "lease-a", c.id)
    wrapped = s.handlers["retire_workers"]
    second = await c.run_on_scheduler(acquire, GracefulRetirement(10), "lease-b", c.id)
    assert (first, second) == (1, 2) and wrapped is not dasks and s.handlers["retire_workers"] is wrapped
    assert await c.run_on_scheduler(release_lease, RETIREMENT_PLUGIN, "lease-a") == 1
    assert RETIREMENT_PLUGIN in s.plugins and s.handlers["retire_workers"] is wrapped
    assert await c.run_on_scheduler(release_lease, RETIREMENT_PLUGIN, "lease-b") == 0
    assert RETIREMENT_PLUGIN not in s.plugins and s.handlers["retire_workers"] == dasks


class SlowRemoval(SchedulerPlugin):
    """A scheduler slow to finish removing a worker, as a loaded one is: heartbeats arrive meanwhile."""

    name = "test-slow-removal"

    async def remove_worker(self, scheduler, worker, *, stimulus_id, **kwargs):
        with contextlib.suppress(asyncio.CancelledError):  # the cluster closing
            await asyncio.sleep(2)


def test_a_collectors_lifetime_restart_worker_comes_back_every_time_under_a_slow_scheduler(make_cluster):
    """Each incarnation of the worker holds a collector's actor, which the test releases when the
    retirement is announced, as a collection's ``RetirementWatcher`` does."""
    cluster = make_cluster(n_workers=1, lifetime="3s", lifetime_stagger="0s", lifetime_restart=True)
    with Client(cluster, set_as_default=False) as client:
        client.register_plugin(SlowRemoval())
        lease = install_retirement_hook(client, timeout=10)
        assert lease is not None
        held: dict[str, Any] = {}
        client.subscribe_topic(
            RETIRING_TOPIC, lambda event: [held.pop(a).release() for a in event[1]["workers"] if a in held]
        )
        seen: set[str] = set()

        def seen_enough() -> bool:
            for address in set(cluster.scheduler.workers) - seen:
                seen.add(address)
                key = f"{ACTOR_KEY_PREFIX}{len(seen)}"
                held[address] = client.submit(collections.Counter, actor=True, workers=[address], key=key)
            return len(seen) >= 3

        wait_until(seen_enough, timeout=45)
        client.unsubscribe_topic(RETIRING_TOPIC)
        held.clear()
        lease.release()
    assert len(seen) >= 3, f"the worker came back {len(seen) - 1} times in 45 s, not twice: {seen}"
