"""Worker joins reach the driver as scheduler events (``daskcollect.membership``)."""

from __future__ import annotations

from distributed import Client

from daskcollect.membership import JoinWatch
from daskcollect.polling import poll_until


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
