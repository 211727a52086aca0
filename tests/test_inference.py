"""daskcollect.inference: env-only collectors served by TorchRL's InferenceServer in Dask actors.

Central inference needs a worker per server besides the collectors' workers: these tests use private
clusters (``client=None`` starts ``num_collectors + inference_workers`` workers), or a cluster of
their own.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch
from distributed import Client
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
        ({"inference": "server", "policy_factory": pendulum_policy}, "policy_factory= is not supported"),
    ],
)
def test_bad_inference_keywords_are_refused_before_any_cluster_starts(kwargs, match):
    policy = None if "policy_factory" in kwargs else pendulum_policy()
    with pytest.raises(ConfigurationError, match=match):
        DaskCollector(make_stateless_pendulum, policy, total_frames=400, **COMMON, **kwargs)


def test_a_lost_inference_server_is_a_named_error_within_seconds(make_cluster):
    cluster = make_cluster(n_workers=3)
    with Client(cluster, set_as_default=False) as client:
        with DaskCollector(make_stateless_pendulum, pendulum_policy(), total_frames=-1, client=client,
                           inference="server", **COMMON) as collector:  # fmt: skip
            batches = iter(collector)
            next(batches)
            (server,) = collector.stats()["inference"]
            pid = client.run(os.getpid, workers=[server["worker"]], callback_timeout=30)[server["worker"]]
            psutil.Process(pid).send_signal(signal.SIGKILL)
            start = time.monotonic()
            with pytest.raises(RolloutError, match="InferenceServerLostError"):
                for _ in range(10_000):  # bounded: each batch is 40 frames
                    next(batches)
            assert time.monotonic() - start < 30
