"""Worker joins and removals reach the driver as the scheduler's own events (``daskcollect.membership``).

Dask's scheduler runs in process (``gen_cluster``) to show the events it logs; the driver's
``ClusterEvents`` runs against a real cluster that grows and shrinks.
"""

from __future__ import annotations

import threading

from distributed import Client, Worker
from distributed.utils_test import gen_cluster

from daskcollect import _internals
from daskcollect.collection.polling import apoll_until, poll_until
from daskcollect.membership.driver import ClusterEvents


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_the_scheduler_logs_each_worker_it_adds_and_removes(c, s, a):
    def changes() -> list[tuple[str, str]]:
        events = s.get_events(_internals.WORKER_EVENTS_TOPIC)
        return [change for _, msg in events if (change := _internals.worker_change(msg)) is not None]

    before = len(changes())
    async with Worker(s.address, nthreads=1) as joined:
        assert await apoll_until(lambda: ("added", joined.address) in changes()[before:], 10)
    assert await apoll_until(lambda: ("removed", joined.address) in changes()[before:], 10)


def test_joins_and_removals_reach_the_listeners_without_a_question_to_the_scheduler(make_cluster):
    cluster = make_cluster(n_workers=1)
    with Client(cluster, set_as_default=False) as client:
        events = ClusterEvents(client, timeout=10)
        left: list[str] = []
        heard = threading.Event()
        events.on_leave(lambda address: (left.append(address), heard.set()))
        try:
            assert events.maybe_joined()  # the first look
            assert not events.maybe_joined()
            first = set(client.scheduler_info()["workers"])
            cluster.scale(2)
            client.wait_for_workers(2, timeout=60)
            assert poll_until(events.maybe_joined, 10, interval=0.05)
            assert not events.maybe_joined()  # the flag is consumed
            (second,) = set(client.scheduler_info()["workers"]) - first
            cluster.scale(1)
            assert events.wait_until(heard.is_set, 30)
            assert len(left) == 1 and left[0] in first | {second}
            assert events.joins >= 1 and events.leaves == 1
        finally:
            events.close()
        assert events.wait_until(lambda: False, 5) is False  # closed: no wait
