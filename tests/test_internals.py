"""daskcollect._internals: the Dask internals we use exist in the installed version, or a clear error says so."""

from __future__ import annotations

import asyncio
import warnings

import distributed
import pytest
import torch
from distributed.utils_test import gen_cluster

from daskcollect import DaskVersionError, _internals
from daskcollect.cluster import NANNY_MONITORS, DriverNanny

#: What a private cluster's nannies drop (``daskcollect.cluster.DriverNanny``): they would measure
#: the driver's process and time its event loop again, as its scheduler does already.
MONITORS = set(NANNY_MONITORS)

TWO = [("127.0.0.1", 1), ("127.0.0.1", 1)]


class Held:
    """A stand-in actor."""


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_the_installed_distributed_is_in_the_tested_range_and_has_every_internal(c, s, a):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _internals.check_version()  # no warning within the tested range
    assert _internals.retire_handler(s) == s.retire_workers
    assert _internals.actor_keys(s, "tcp://127.0.0.1:1") == []
    actor = c.submit(Held, actor=True, key="held-0")
    await actor
    assert _internals.actor_keys(s, a.address) == ["held-0"]
    assert _internals.tick_callback(a) is a.periodic_callbacks["tick"]
    _internals.stop_loop(c)  # an asynchronous Client's loop is not its own: nothing to stop, nothing raised
    assert c.status == "running"


@gen_cluster(nthreads=[("127.0.0.1", 1)], Worker=distributed.Nanny)
async def test_dasks_nanny_runs_the_monitors_that_a_private_clusters_nanny_drops(s, a):
    assert set(a.periodic_callbacks) >= MONITORS  # a rename here would make DriverNanny drop nothing


@gen_cluster(nthreads=[("127.0.0.1", 1)], Worker=DriverNanny)
async def test_a_private_clusters_nanny_runs_none_of_them(s, a):
    assert not MONITORS & set(a.periodic_callbacks) and "monitor" in s.periodic_callbacks


class NotAScheduler:
    """Stands for a future Scheduler that dropped the internal."""


def test_a_missing_internal_is_a_typed_error_naming_it_and_the_fix():
    with pytest.raises(DaskVersionError) as info:
        _internals.retire_handler(NotAScheduler())
    message = str(info.value)
    assert "retire_workers" in message and distributed.__version__ in message
    assert f"distributed>={_internals.TESTED[0]},<{_internals.TESTED[1]}" in message
    assert info.value.internal.startswith("Scheduler.handlers")
    with pytest.raises(DaskVersionError, match="Worker.periodic_callbacks"):
        _internals.tick_callback(object())
    with pytest.raises(DaskVersionError, match="_loop_runner"):
        _internals.stop_loop(object())


@gen_cluster(client=True, nthreads=TWO)
async def test_the_scheduler_and_worker_internals_answer_as_dask_does(c, s, a, b):
    names = _internals.worker_addresses_by_name(s)
    assert names == {a.address: str(a.name), b.address: str(b.name)}
    assert set(_internals.workers_to_close(s, n=1, memory_ratio=None)) <= {a.address, b.address}
    assert len(_internals.workers_to_close(s, n=1, memory_ratio=None)) == 1
    future = c.submit(int, 7, workers=[a.address], key="seven")
    await future
    assert _internals.local_data(a, "seven") == 7 and _internals.local_data(b, "seven") is None
    await c.publish_dataset(future, name="daskcollect-test-set")
    assert _internals.published_datasets(s) == ["daskcollect-test-set"]
    del future
    assert _internals.drop_dataset(s, "daskcollect-test-set") and not _internals.drop_dataset(s, "nothing")
    assert _internals.published_datasets(s) == []
    for _ in range(500):  # the release reaches the worker over its stream: bounded wait
        if "seven" not in s.tasks:
            break
        await asyncio.sleep(0.01)
    assert "seven" not in s.tasks  # nothing holds the key any more
    assert "daskcollect-test-topic" not in _internals.subscribed_topics(s)
    c.subscribe_topic("daskcollect-test-topic", lambda event: None)
    for _ in range(500):  # the subscription travels on the client's batched stream: bounded wait
        if "daskcollect-test-topic" in _internals.subscribed_topics(s):
            break
        await asyncio.sleep(0.01)
    assert "daskcollect-test-topic" in _internals.subscribed_topics(s)

    async def daskcollect_test_echo(value: int) -> int:
        return value + 1

    _internals.add_handlers(a, {"daskcollect_test_echo": daskcollect_test_echo})
    assert await _internals.rpc(c, a.address).daskcollect_test_echo(value=1) == 2  # from a client
    assert await _internals.rpc(b, a.address).daskcollect_test_echo(value=2) == 3  # from a worker
    assert _internals.remove_handlers(a, "daskcollect_test_") == ["daskcollect_test_echo"]
    assert "daskcollect_test_echo" not in a.handlers


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_worker_reads_a_variable_set_by_a_client(c, s, a):
    assert await _internals.read_variable(a, "daskcollect-test-var", timeout=0.1) is None  # not set: None
    variable = distributed.Variable("daskcollect-test-var", client=c)
    await variable.set({"routes": [["tcp://127.0.0.1:1", "x"]], "failed": None})
    value = await _internals.read_variable(a, "daskcollect-test-var", timeout=5)
    assert [list(route) for route in value["routes"]] == [["tcp://127.0.0.1:1", "x"]]  # tuples in-process
    assert value["failed"] is None
    with pytest.raises(DaskVersionError, match="Worker.scheduler"):
        await _internals.read_variable(object(), "daskcollect-test-var", timeout=1)


def test_sync_runs_a_coroutine_on_another_threads_loop(client):
    async def add(x: int, y: int) -> int:
        return x + y

    assert _internals.sync(client.loop, add, 2, 3, callback_timeout=10) == 5


def test_torchrls_and_tensordicts_internals_are_where_the_fence_looks():
    from makers import cartpole_policy, make_cartpole
    from tensordict import TensorDict
    from torchrl.collectors import Collector
    from torchrl.collectors._constants import DEFAULT_EXPLORATION_TYPE

    assert _internals.default_exploration_type() is DEFAULT_EXPLORATION_TYPE
    assert _internals.tensordict_unchecked() == TensorDict._new_unsafe
    collector = Collector(make_cartpole, cartpole_policy(), frames_per_batch=10, total_frames=10)
    try:
        calls = []

        def wrap(policy):
            def counted(*args, **kwargs):
                calls.append(1)
                return policy(*args, **kwargs)

            return counted

        assert _internals.wrap_collector_policy(collector, wrap)
        batch = next(iter(collector))
        assert batch.numel() == 10 and len(calls) == 10  # every step's action came through the wrapper
    finally:
        collector.shutdown()
    assert not _internals.wrap_collector_policy(object(), wrap)  # elsewhere: nothing changes


def test_a_collectors_weight_sync_schemes_are_where_torchrls_dispatch_looks():
    from makers import cartpole_policy, make_cartpole
    from tensordict import TensorDict
    from torchrl.collectors import Collector
    from torchrl.weight_update import WeightSyncScheme

    sent = []

    class Recorder(WeightSyncScheme):
        def create_transport(self, **kwargs):
            return None

        def send(self, weights=None, worker_ids=None):
            sent.append((weights, worker_ids))

    collector = Collector(make_cartpole, cartpole_policy(), frames_per_batch=10, total_frames=10)
    try:
        weights = TensorDict.from_module(cartpole_policy()).data
        _internals.set_weight_sync_schemes(collector, {"policy": Recorder()})
        collector.update_policy_weights_(weights, worker_ids=[0])
        assert len(sent) == 1 and sent[0][0] is weights and sent[0][1] == [0]
    finally:
        collector.shutdown()


def test_a_collectors_carrier_is_where_the_fence_looks():
    from makers import cartpole_policy, make_cartpole
    from torchrl.collectors import Collector

    collector = Collector(make_cartpole, cartpole_policy(), frames_per_batch=10, total_frames=-1)
    try:
        carrier = _internals.collector_carrier(collector)
        assert carrier is not None and "observation" in carrier.keys()
        start = carrier.clone()
        batch = next(iter(collector))
        _internals.set_collector_carrier(collector, start.clone())
        again = next(collector.iterator())
        assert torch.equal(again["observation"][0], batch["observation"][0])  # it starts from the carrier
    finally:
        collector.shutdown()
    assert _internals.collector_carrier(object()) is None
    with pytest.raises(DaskVersionError, match="_carrier"):
        _internals.set_collector_carrier(object(), start)
