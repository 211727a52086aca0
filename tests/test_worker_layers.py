"""Collections that share workers (``daskcollect.worker.layers``): each sees its own ``worker_env``, and
closing them in either order leaves every worker as found."""

from __future__ import annotations

import os

import pytest
from helpers import wait_until
from makers import VariableEnv, variable_code

from daskcollect import DaskCollector
from daskcollect.testing import cluster_state, differences
from daskcollect.worker.layers import Layer, Layers

WHO = "DASKCOLLECT_TEST_WHO"


class Tick:
    """Stands for the worker's tick callback: a ``callback_time`` in milliseconds."""

    callback_time = 20.0


def test_layers_show_the_latest_and_give_way_in_any_order():
    layers, tick = Layers(), Tick()
    os.environ.pop(WHO, None)
    os.environ["DASKCOLLECT_TEST_KEPT"] = "found"
    try:
        layers.push("a", Layer({WHO: "a", "DASKCOLLECT_TEST_KEPT": "a"}, 100.0), tick)
        layers.push("b", Layer({WHO: "b"}, None), tick)
        assert (
            os.environ[WHO] == "b"
            and os.environ["DASKCOLLECT_TEST_KEPT"] == "a"
            and tick.callback_time == 100
        )
        with layers.scoped({WHO: "a"}):
            assert os.environ[WHO] == "a"  # a's collector call
            assert not layers.pop("b", tick)  # b closes meanwhile: a's call keeps its value
            assert os.environ[WHO] == "a"
        assert os.environ[WHO] == "a"  # the layer left
        assert layers.pop("a", tick)  # the last one
        assert (
            WHO not in os.environ
            and os.environ["DASKCOLLECT_TEST_KEPT"] == "found"
            and tick.callback_time == 20
        )
        assert layers.sizes() == {"layers": 0, "found variables": 0}
    finally:
        os.environ.pop("DASKCOLLECT_TEST_KEPT", None)
        os.environ.pop(WHO, None)


def collection(client, who: str) -> DaskCollector:
    return DaskCollector(
        VariableEnv, frames_per_batch=20, total_frames=-1, num_collectors=2, sync=True, client=client,
        worker_env={WHO: who},
    )  # fmt: skip


def sees(batch, who: str) -> bool:
    code = variable_code(who)
    return bool((batch["observation"] == code).all() and (batch["next", "observation"] == code).all())


@pytest.mark.parametrize("first_out", ["first", "second"])
def test_two_collections_at_once_see_their_own_env_and_leave_the_cluster_as_found(client, first_out):
    before = cluster_state(client)
    first = collection(client, "first")
    try:
        second = collection(client, "second")
        try:
            assert set(first.workers) == set(second.workers)  # they share both workers
            batches = {"first": iter(first), "second": iter(second)}
            for _ in range(3):  # interleaved, while both run
                for who, batches_of in batches.items():
                    assert sees(next(batches_of), who), who
            (first if first_out == "first" else second).shutdown()
            left = "second" if first_out == "first" else "first"
            assert sees(next(batches[left]), left)  # the other one keeps its variables
        finally:
            second.shutdown()
    finally:
        first.shutdown()
    wait_until(lambda: cluster_state(client) == before, timeout=10)
    assert differences(before, cluster_state(client)) == []
