"""TLS clusters: collection (the completion streams included) over tls://, our collector passes the Security object through, no cert no entry."""

from __future__ import annotations

import os

import dask
import pytest
from distributed import Client
from distributed.security import Security
from helpers import streams_served
from makers import make_cartpole

from daskcollect import ClusterConnectionError, DaskCollector

pytest.importorskip("cryptography", reason="Security.temporary() needs cryptography (the 'tls' extra)")


def test_collects_over_tls_with_a_users_client(tls_cluster):
    """The rollouts come back over TLS. The cluster shares the driver's host, where they would take
    the same-host channel (a Unix socket, which never leaves the host): turned off here."""
    assert tls_cluster.scheduler_address.startswith("tls://")
    with (
        Client(tls_cluster, set_as_default=False) as client,
        dask.config.set({"daskcollect.streams.same-host": False}),
    ):
        with DaskCollector(
            make_cartpole, frames_per_batch=100, total_frames=400, num_collectors=2, client=client
        ) as c:
            frames = sum(b.numel() for b in c)
            assert c.client is client  # daskcollect's own client took its security: the streams show it
            assert all(w.startswith("tls://") for w in c.workers)
            # The rollouts came back over TLS too: each collector's completion stream.
            streams = [a for s in client.run(streams_served).values() for a in s.values()]
            assert len(streams) == 2 and all(a.startswith("tls://") for a in streams)
    assert frames == 400


def test_collects_over_tls_with_an_address_and_security(tls_cluster):
    with DaskCollector(
        make_cartpole, frames_per_batch=100, total_frames=200, num_collectors=2,
        client=tls_cluster.scheduler_address, security=tls_cluster.security,
    ) as c:  # fmt: skip
        assert c.client.security is tls_cluster.security
        assert sum(b.numel() for b in c) == 200


def test_no_certificate_is_refused(tls_cluster):
    """Without certificates the scheduler cannot be reached; the error says so and how to fix it."""
    with pytest.raises(ClusterConnectionError, match="speaks TLS and no certificates were given") as info:
        DaskCollector(make_cartpole, frames_per_batch=10, client=tls_cluster.scheduler_address)
    assert "TLS" in str(info.value.__cause__)  # Dask's own refusal: no SSL context for tls://


def test_a_private_cluster_with_security_speaks_tls_from_its_scheduler_process():
    with DaskCollector(
        make_cartpole, frames_per_batch=100, total_frames=200, num_collectors=2, security=Security.temporary()
    ) as c:
        assert sum(b.numel() for b in c) == 200
        assert c.client.scheduler.address.startswith("tls://")
        assert all(w.startswith("tls://") for w in c.workers)
        assert c.client.run_on_scheduler(os.getpid) != os.getpid()  # the scheduler's own process
