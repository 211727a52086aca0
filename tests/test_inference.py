"""daskcollect.inference: env-only collectors served by TorchRL's InferenceServer in Dask actors.

Central inference needs a worker per server besides the collectors' workers: these tests use private
clusters (``client=None`` starts ``num_collectors + inference_workers`` workers), or a cluster of
their own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import dask
import psutil
import pytest
import torch
from distributed import Client
from helpers import CHROMIUM, chromium, dashboard_base
from makers import make_stateless_pendulum, pendulum_policy

from daskcollect import ConfigurationError, DaskCollector, RolloutError
from daskcollect.inference.transport import latencies

COMMON = dict(frames_per_batch=40, max_frames_per_traj=25, num_collectors=2)


def test_sync_central_inference_yields_the_frames_of_per_collector_inference():
    with DaskCollector(make_stateless_pendulum, pendulum_policy(), total_frames=400, sync=True, seed=5,
                       inference="server", **COMMON) as central:  # fmt: skip
        served = list(central)
        stats = central.stats()["inference"]
        assert len(set(central.workers) | {s["worker"] for s in stats}) == 3  # servers host no collector
        assert sum(map(len, central.client.run(latencies, callback_timeout=30).values())) > 0
    with DaskCollector(make_stateless_pendulum, pendulum_policy(), total_frames=400, sync=True, seed=5,
                       **COMMON) as local:  # fmt: skip
        own = list(local)
    assert len(served) == len(own) == 10
    for a, b in zip(served, own, strict=True):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in ("th", "thdot", "action", ("next", "th"), ("collector", "traj_ids")):
            assert torch.equal(a[key], b[key]), key
    (server,) = stats
    assert server["requests"] == 400 + 2  # each env step, and each collector's first reset's probe
    assert server["avg_batch_size"] >= 1.0


def test_weights_go_to_the_servers_and_the_frames_carry_their_version():
    policy = pendulum_policy()
    with DaskCollector(make_stateless_pendulum, policy, total_frames=-1, track_policy_version=True,
                       inference="server", **COMMON) as collector:  # fmt: skip
        batches = iter(collector)
        first = next(batches)
        assert (first["policy_version"] == 0).all()
        with torch.no_grad():
            for p in policy.parameters():
                p.zero_()
        collector.update_policy_weights_()
        for batch in batches:  # async: a rollout started before the update may still come
            if (batch["policy_version"] == 1).all():
                break
        assert (batch["action"] == 0).all()  # the zeroed policy acted
        assert collector.stats()["inference"][0]["weight_updates"] == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"inference": "gpu"}, "inference='gpu' is not known"),
        ({"inference": "server", "inference_workers": 0}, "inference_workers must be an int >= 1"),
        ({"inference": "server", "inference_options": {"batch": 3}}, "unknown keys"),
        (
            {"inference": "server", "inference_options": {"max_in_flight": 0}},
            "max_in_flight'] must be an int >= 1",
        ),
        ({"inference": "server", "policy_factory": pendulum_policy}, "policy_factory= is not supported"),
    ],
)
def test_bad_inference_keywords_are_refused_before_any_cluster_starts(kwargs, match):
    policy = None if "policy_factory" in kwargs else pendulum_policy()
    with pytest.raises(ConfigurationError, match=match):
        DaskCollector(make_stateless_pendulum, policy, total_frames=400, **COMMON, **kwargs)


def test_central_inference_with_a_reattach_grace_period_is_refused_before_any_cluster_starts():
    with dask.config.set({"daskcollect.reattach.grace-period": "30s"}):
        with pytest.raises(ConfigurationError, match="inference='server' cannot be re-attached"):
            DaskCollector(
                make_stateless_pendulum, pendulum_policy(), total_frames=400, inference="server", **COMMON
            )


def kill_server(client, stats):
    """SIGKILLs the worker process of the one server in ``stats``; returns its address."""
    (server,) = stats
    pid = client.run(os.getpid, workers=[server["worker"]], callback_timeout=30)[server["worker"]]
    psutil.Process(pid).send_signal(signal.SIGKILL)
    return server["worker"]


def test_a_killed_inference_worker_is_replaced_and_its_requests_retried(make_cluster):
    """Sync, deterministic policy: killed mid-run, the server comes back elsewhere and the run's frames
    equal per-collector inference's, value for value: the exact total, none lost, none twice."""
    cluster = make_cluster(n_workers=4)  # 2 collectors, 1 server, 1 spare
    common = dict(COMMON, total_frames=2000, sync=True, seed=5, client=None)
    with Client(cluster, set_as_default=False) as client:
        common["client"] = client
        with DaskCollector(
            make_stateless_pendulum, pendulum_policy(), inference="server", **common
        ) as central:
            batches = iter(central)
            served = [next(batches), next(batches)]
            killed = kill_server(client, central.stats()["inference"])
            start = time.monotonic()
            served += list(batches)
            took = time.monotonic() - start
            (server,) = central.stats()["inference"]
            hosts = set(central.workers)
        with DaskCollector(make_stateless_pendulum, pendulum_policy(), **common) as local:
            own = list(local)
    assert server["replaced"] == 1 and server["worker"] != killed and server["worker"] not in hosts
    assert took < 60
    assert len(served) == len(own) == 50
    for a, b in zip(served, own, strict=True):
        for key in ("th", "thdot", "action", ("next", "th"), ("collector", "traj_ids")):
            assert torch.equal(a[key], b[key]), key


def test_an_inference_worker_that_cannot_be_replaced_is_a_named_error_within_seconds(make_cluster):
    """The only worker with the server's resources dies, with no nanny to bring it back: the requests
    waiting for it fail with InferenceServerLostError once ``timeouts.workers`` has passed."""
    cluster = make_cluster(n_workers=2)
    alone = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address, "--host", "127.0.0.1",
         "--nthreads", "1", "--no-dashboard", "--no-nanny", "--resources", "infer=1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        with (
            Client(cluster, set_as_default=False) as client,
            dask.config.set({"daskcollect.timeouts.workers": 3}),
        ):
            client.wait_for_workers(3, timeout=60)
            with DaskCollector(make_stateless_pendulum, pendulum_policy(), total_frames=-1, client=client,
                               inference="server", inference_resources={"infer": 1}, **COMMON) as collector:  # fmt: skip
                batches = iter(collector)
                next(batches)
                kill_server(client, collector.stats()["inference"])
                start = time.monotonic()
                with pytest.raises(RolloutError, match="InferenceServerLostError") as caught:
                    for _ in range(10_000):  # bounded: each batch is 40 frames
                        next(batches)
                assert time.monotonic() - start < 30
                assert "no worker with resources {'infer': 1} was free" in str(caught.value)
    finally:
        alone.kill()
        alone.wait(timeout=30)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_dashboard_page_shows_each_servers_batches_queue_and_action_latency(make_cluster, tmp_path):
    cluster = make_cluster(n_workers=3)
    base = dashboard_base(cluster)
    with Client(cluster, set_as_default=False) as client:
        with DaskCollector(make_stateless_pendulum, pendulum_policy(), total_frames=-1, client=client,
                           inference="server", **COMMON) as collector:  # fmt: skip
            batches, shown, deadline = iter(collector), None, time.monotonic() + 60
            while shown is None and time.monotonic() < deadline:  # bounded in time and in batches
                next(batches)
                page = json.loads(urllib.request.urlopen(base + "/daskcollect/json", timeout=10).read())
                rows = [
                    row for c in page.values() if c["state"] == "collecting" for row in c.get("inference", [])
                ]
                shown = next((row for row in rows if row["p99_action_ms"] is not None), None)
            assert shown is not None, "the page never showed an inference server with latencies"
            dom = chromium(tmp_path, "--dump-dom", base + "/daskcollect")
    server = shown
    assert server["requests"] > 0 and server["avg_batch_size"] >= 1 and server["queue_depth"] >= 0
    assert 0 < server["p50_action_ms"] <= server["p99_action_ms"]
    table = re.search(r'<table class="inference".*?</table>', dom, re.S)
    assert table is not None and server["name"] in table.group(0) and server["worker"] in table.group(0)
    assert "action latency p50 / p99 (ms)" in table.group(0)
