"""Bad input: a typed error within seconds that names the cause and the fix."""

from __future__ import annotations

import socket
import threading
import time

import dask
import pytest
from helpers import NO_SCHEDULER, actors_on, children, wait_until
from makers import cartpole_policy, failing_env, make_cartpole

from daskcollect import (
    ClusterConnectionError,
    CollectorBuildError,
    ConfigurationError,
    DaskCollector,
    EnvConstructionError,
    NotEnoughWorkersError,
    PolicyFactoryError,
    PolicySerializationError,
    RolloutError,
)


def no_actors(client) -> bool:
    return sum(len(v) for v in actors_on(client).values()) == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"frames_per_batch": 0}, "frames_per_batch must be > 0"),
        ({"frames_per_batch": -5}, "frames_per_batch must be > 0"),
        ({"frames_per_batch": 10, "total_frames": 0}, "total_frames must be -1"),
        ({"frames_per_batch": 10, "total_frames": -2}, "total_frames must be -1"),
        (
            {"frames_per_batch": 10, "num_collectors": 3, "device": ["cpu", "cpu"]},
            "device is a list of length 2",
        ),
        (
            {"frames_per_batch": 10, "num_collectors": 2, "collector_kwargs": [{}]},
            "collector_kwargs is a list",
        ),
        ({"frames_per_batch": 10, "collector_class": "fancy"}, "collector_class='fancy'"),
        ({"frames_per_batch": 10, "worker_env": {"A": 1}}, "worker_env must map str to str"),
        ({"frames_per_batch": 10, "max_weight_update_interval": -3}, "max_weight_update_interval"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        DaskCollector(make_cartpole, client=NO_SCHEDULER, **kwargs)


def test_list_length_differs_from_num_collectors():
    with pytest.raises(ConfigurationError, match="create_env_fn is a list of length 2"):
        DaskCollector(
            [make_cartpole, make_cartpole], frames_per_batch=10, num_collectors=3, client=NO_SCHEDULER
        )


def test_env_constructor_raises_on_worker(client):
    start = time.monotonic()
    with pytest.raises(EnvConstructionError) as info:
        DaskCollector(failing_env, frames_per_batch=10, client=client)
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert "on worker tcp://127.0.0.1:" in message  # which worker
    assert "makers.failing_env" in message  # which constructor
    assert "ValueError: this env constructor always fails" in message  # the original exception
    assert "Traceback" in message and "makers.py" in message  # its traceback
    assert isinstance(info.value, RuntimeError)
    assert wait_until(lambda: no_actors(client))


def test_policy_factory_raises_on_worker(client):
    def factory():
        raise RuntimeError("no weights file here")

    with pytest.raises(PolicyFactoryError, match="no weights file here") as info:
        DaskCollector(make_cartpole, policy_factory=factory, frames_per_batch=10, client=client)
    assert "policy_factory" in str(info.value)
    assert isinstance(info.value, CollectorBuildError)


def test_unpicklable_policy(client):
    policy = cartpole_policy()
    policy.lock = threading.Lock()  # cannot be pickled
    with pytest.raises(PolicySerializationError, match="policy_factory") as info:
        DaskCollector(make_cartpole, policy, frames_per_batch=10, client=client)
    assert "cannot be pickled" in str(info.value)
    assert isinstance(info.value, TypeError)
    assert no_actors(client)


def test_unreachable_scheduler():
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = children()
    start = time.monotonic()
    # The connect timeout bounds the wait (a scheduler may still be starting): 1 s here.
    with (
        dask.config.set({"daskcollect.timeouts.connect": "1s"}),
        pytest.raises(ClusterConnectionError, match=f"127.0.0.1:{port}") as info,
    ):
        DaskCollector(make_cartpole, frames_per_batch=10, client=f"tcp://127.0.0.1:{port}")
    assert time.monotonic() - start < 10
    assert "Check that the scheduler is running" in str(info.value)
    assert children() <= before


def test_too_few_workers(client):
    start = time.monotonic()
    with dask.config.set({"daskcollect.timeouts.workers": "2s"}):
        with pytest.raises(NotEnoughWorkersError, match="Needed 3 workers") as info:
            DaskCollector(make_cartpole, frames_per_batch=10, num_collectors=3, client=client)
    assert time.monotonic() - start < 20
    assert info.value.needed == 3 and info.value.found == 2
    assert "the scheduler lists 2 eligible workers: 0 host this collection's collectors" in str(info.value)
    assert no_actors(client)


def test_missing_resources(client):
    import dask

    with dask.config.set({"daskcollect.timeouts.workers": "1s"}):
        with pytest.raises(NotEnoughWorkersError, match=r"declaring resources \{'GPU': 1\}"):
            DaskCollector(make_cartpole, frames_per_batch=10, worker_resources={"GPU": 1}, client=client)


def test_rollout_error_names_worker_and_collector(client):
    from makers import make_env_failing_after

    with pytest.raises(RolloutError) as info:
        with DaskCollector(
            make_env_failing_after, frames_per_batch=20, total_frames=200, sync=True, client=client
        ) as collector:
            list(collector)
    message = str(info.value)
    assert "on worker tcp://127.0.0.1:" in message
    assert "collector 0" in message or "collector 1" in message
    assert "step budget exhausted" in message and "Traceback" in message
    assert collector.closed  # TorchRL's contract: an error shuts the collector down
    assert wait_until(lambda: no_actors(client))


def test_daemonic_worker_gets_a_fix(make_cluster):
    from distributed import Client

    cluster = make_cluster(n_workers=1, daemon=True)
    with Client(cluster, set_as_default=False) as client:
        with pytest.raises(CollectorBuildError, match="DASK_DISTRIBUTED__WORKER__DAEMON=False"):
            DaskCollector(make_cartpole, frames_per_batch=10, num_workers_per_collector=2, client=client)
