"""Worker joins reach the driver as scheduler events (``daskcollect.membership``).

The scheduler plugin runs in process (Dask's ``gen_cluster``); the driver's
``JoinWatch`` runs against a real cluster that grows.
"""

from __future__ import annotations

from distributed import Client, Worker
from distributed.utils_test import gen_cluster

from daskcollect.membership import JOINED_TOPIC, MEMBERSHIP_PLUGIN, JoinWatch, MembershipEvents
from daskcollect.polling import apoll_until, poll_until


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_the_plugin_logs_each_worker_that_joins(c, s, a):
    await c.register_plugin(MembershipEvents(), name=MEMBERSHIP_PLUGIN)
    assert s.get_events(JOINED_TOPIC) == ()  # the workers already there are not announced
    async with Worker(s.address, nthreads=1) as joined:

        def announced() -> list[str]:
            return [msg["worker"] for _, msg in s.get_events(JOINED_TOPIC)]

        assert await apoll_until(lambda: announced() == [joined.address], 10)


def test_a_joining_worker_is_announced_by_an_event(make_cluster):
    cluster = make_cluster(n_workers=1)
    with Client(cluster, set_as_default=False) as client:
        watch = JoinWatch(client, interval=3600.0)  # no timer within the test: only events say "look"
        try:
            assert watch.events
            assert watch.maybe_joined()  # the first look
            assert not watch.maybe_joined()
            cluster.scale(2)
            client.wait_for_workers(2, timeout=60)
            assert poll_until(watch.maybe_joined, 10, interval=0.05)
            assert not watch.maybe_joined()  # the flag is consumed
        finally:
            watch.close()
        plugins = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
        assert MEMBERSHIP_PLUGIN not in plugins  # the watch's lease was the last
