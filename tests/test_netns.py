"""Cross-host run: the scheduler and each worker in their own Linux network namespace.

The hosts are linked by veth pairs to a bridge in the test's namespace, with their own addresses in
10.213.0.0/24; the driver (this process) connects over real TCP. Mid-run, one worker's link is cut
(`ip link set ... down`): the collector drops that worker and completes. Traffic goes only to the
addresses of these test hosts. Every process and namespace the test makes is removed, even on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time

import dask
import pytest
import torch

from daskcollect import DaskCollector
from daskcollect.testing import make_cartpole

SUBNET = "10.213.0"
BRIDGE = "dcbr0"
HOSTS = ["sched", "w1", "w2", "w3"]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    try:
        sh("ip", "netns", "add", "dc-probe")
        sh("ip", "netns", "del", "dc-probe")
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create network namespaces here: {exc}"
    return None


@pytest.fixture
def hosts():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    tag = str(os.getpid() % 10000)
    made_ns, procs = [], []
    addresses = {h: f"{SUBNET}.{10 + i}" for i, h in enumerate(HOSTS)}
    host_veth = {h: f"dch{i}{tag}"[:15] for i, h in enumerate(HOSTS)}
    try:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i, h in enumerate(HOSTS):
            ns, inner = f"dc-{h}-{tag}", f"dcn{i}{tag}"[:15]
            sh("ip", "netns", "add", ns)
            made_ns.append(ns)
            sh("ip", "link", "add", host_veth[h], "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", host_veth[h], "master", BRIDGE)
            sh("ip", "link", "set", host_veth[h], "up")
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addresses[h]}/24", "dev", inner)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

        env = {
            **os.environ,
            "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "5s",
            "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
            "PYTHONWARNINGS": "ignore",
        }
        sched = f"tcp://{addresses['sched']}:8786"

        def spawn(host: str, *args: str) -> None:
            cmd = ["ip", "netns", "exec", f"dc-{host}-{tag}", sys.executable, "-m", *args]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))  # fmt: skip

        spawn("sched", "distributed.cli.dask_scheduler", "--host", addresses["sched"], "--port", "8786",
              "--no-dashboard")  # fmt: skip
        time.sleep(2)
        for h in HOSTS[1:]:
            spawn(h, "distributed.cli.dask_worker", sched, "--host", addresses[h], "--nthreads", "1",
                  "--no-dashboard", "--no-nanny")  # fmt: skip
        yield sched, addresses, host_veth
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        for ns in made_ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, timeout=30)


def test_cut_link_mid_run(hosts):
    sched, addresses, host_veth = hosts
    from distributed import Client

    with Client(sched, timeout=30, set_as_default=False) as c:
        c.wait_for_workers(3, timeout=60)
    timeouts = {
        "daskcollect.timeouts.rollout": "8s",
        "daskcollect.timeouts.shutdown": "10s",
        "daskcollect.liveness-interval": "0.5s",
        "daskcollect.restart-delay": "0.2s",
    }
    with dask.config.set(timeouts):
        with DaskCollector(
            make_cartpole, frames_per_batch=200, total_frames=200 * 30, num_collectors=2, client=sched
        ) as collector:  # fmt: skip
            assert all(w.startswith(f"tcp://{SUBNET}.") for w in collector.workers)
            cut = next(h for h in HOSTS[1:] if collector.workers[0].startswith(f"tcp://{addresses[h]}:"))
            start, batches = time.monotonic(), []
            for i, batch in enumerate(collector):
                batches.append(batch)
                if i == 4:
                    sh("ip", "link", "set", host_veth[cut], "down")  # the worker's link is cut
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
    assert not any(w.startswith(f"tcp://{addresses[cut]}:") for w in collector.workers)
