"""Cross-host runs: the scheduler and the workers in their own Linux network namespaces.

The hosts are linked by veth pairs to a bridge in the test's namespace, with their own addresses in
10.213.N.0/24 (N from the pid); the driver (this process) connects over real TCP. Mid-run, one worker's link is cut
(`ip link set ... down`): the collector drops that worker and completes. Weights updates reach every
worker of every host through the Dask route (copied host to host, then within each host). Traffic
goes only to the addresses of these test hosts. Every process and namespace the tests make is
removed, even on failure.
"""

from __future__ import annotations

import os
import time

import dask
import pytest
import torch
from makers import (
    make_cartpole,
    make_cartpole_in_worker_context,
    set_constant_action,
    worker_context_policy,
)
from netns import FAST_FAILURE_ENV, SimulatedHosts, unavailable

from daskcollect import DaskCollector

#: A /24 of this process's own: suites running side by side on one machine do not share addresses.
SUBNET = f"10.213.{os.getpid() % 250}"
HOSTS = ["sched", "w1", "w2", "w3"]


def rig_with(workers_per_host: int, env: dict[str, str] | None = None):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with SimulatedHosts(HOSTS, subnet=SUBNET) as rig:
        sched = rig.scheduler("sched", env=env)
        for h in HOSTS[1:]:
            rig.workers(h, sched, n=workers_per_host)
        yield sched, rig


@pytest.fixture
def hosts():
    yield from rig_with(1, FAST_FAILURE_ENV)


@pytest.fixture
def hosts_of_two():
    yield from rig_with(2)


def test_cut_link_mid_run(hosts):
    sched, rig = hosts
    from distributed import Client

    with Client(sched, timeout=30, set_as_default=False) as c:
        c.wait_for_workers(3, timeout=60)
    timeouts = {
        # The hosts share this machine's /dev/shm: with it off, nothing goes around the cut link
        # (the weights would take it on a shared host).
        "daskcollect.weights.shared-memory": False,
        "daskcollect.timeouts.rollout": "8s",
        "daskcollect.timeouts.shutdown": "10s",
        "daskcollect.restart-delay": "0.2s",
    }
    with dask.config.set(timeouts):
        with DaskCollector(
            make_cartpole, frames_per_batch=200, total_frames=200 * 30, num_collectors=2, client=sched
        ) as collector:  # fmt: skip
            assert all(w.startswith(f"tcp://{SUBNET}.") for w in collector.workers)
            cut = rig_host(rig, collector.workers[0])
            start, batches = time.monotonic(), []
            for i, batch in enumerate(collector):
                batches.append(batch)
                if i == 4:
                    rig.cut(cut)  # the worker's link is cut
                assert time.monotonic() - start < 120
            stats = collector.stats()
    assert sum(b.numel() for b in batches) == 200 * 30
    assert stats["restarts"] >= 1 and stats["live_collectors"] == 2
    pairs = torch.cat(
        [
            torch.stack([b["collector", "collector_id"], b["collector", "rollout_id"]], -1).unique(dim=0)
            for b in batches
        ]
    )
    assert len(pairs) == len(pairs.unique(dim=0))  # no rollout yielded twice
    assert cut not in {rig_host(rig, w) for w in collector.workers}


def test_weights_reach_every_worker_of_every_host(hosts_of_two):
    """Also: on the other hosts, the env's constructor and steps and the policy's forward run in their
    worker's context (``get_worker()``), as on the driver's host (``test_streams.py``)."""
    sched, rig = hosts_of_two
    policy = worker_context_policy(0)
    # The hosts share this machine's /dev/shm; with it off the weights take the route to other hosts.
    with dask.config.set({"daskcollect.weights.shared-memory": False, "daskcollect.timeouts.workers": "60s"}):
        with DaskCollector(
            make_cartpole_in_worker_context, policy, frames_per_batch=6 * 10, total_frames=-1, num_collectors=6,
            sync=True, client=sched, track_policy_version=True,
        ) as collector:  # fmt: skip
            assert len({rig_host(rig, w) for w in collector.workers}) == 3
            it = iter(collector)
            assert next(it)["action"].argmax(-1).unique().tolist() == [0]
            for version, action in ((1, 1), (2, 0), (3, 1)):
                set_constant_action(policy.module[0], action)
                start = time.monotonic()
                collector.update_policy_weights_()
                batch = next(it)
                assert time.monotonic() - start < 30
                for i in range(6):  # every collector, leader of its host or not
                    assert batch[i]["action"].argmax(-1).unique().tolist() == [action]
                    assert batch[i]["policy_version"].unique().tolist() == [version]
            collectors = collector.stats()["collectors"]
            assert {c["weights_route"] for c in collectors} == {"dask"}
    for i, c in enumerate(collectors):
        assert batch[i]["worker_port"].unique().tolist() == [int(c["worker"].rsplit(":", 1)[1])]


def rig_host(rig, address: str) -> str:
    return next(h for h, ip in rig.addresses.items() if address.startswith(f"tcp://{ip}:"))
