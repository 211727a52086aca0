"""The weight router in isolation: one write per route, versions, pending weights, adoption."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from tensordict import TensorDict

from daskcollect.weights.payload import Sent, WeightsPayload
from daskcollect.weights.router import WeightRouter


@dataclass(frozen=True)
class Ref:
    version: int
    route: str


class RecordingTransport:
    """A transport that keeps what it was asked to send (no cluster needed)."""

    def __init__(self, route: str, room: bool = True):
        self.route, self.room = route, room
        self.sends: list[tuple[int, list[str]]] = []
        self.closed = False
        self.probe = None

    def send(self, weights, version, addresses):
        if not self.room:
            return None
        self.sends.append((version, sorted(addresses)))
        return Sent(Ref(version, self.route), WeightsPayload.pack(weights, version), object(), self.route)

    def close(self, timeout: float = 5.0):
        self.closed = timeout


@dataclass
class Target:
    index: int
    address: str
    on_driver_host: bool


def weights(value: float = 0.0) -> TensorDict:
    return TensorDict(w=torch.full((3,), value))


@pytest.fixture
def transports():
    return RecordingTransport("dask"), RecordingTransport("shared-memory")


def test_one_write_per_route_whatever_the_number_of_collectors(transports):
    scatter, shm = transports
    router = WeightRouter(scatter, shm)
    targets = [Target(0, "a", True), Target(1, "b", True), Target(2, "c", False), Target(3, "d", False)]
    assert router.publish(weights(1), targets) == 1
    assert shm.sends == [(1, ["a", "b"])] and scatter.sends == [(1, ["c", "d"])]
    assert [router.pending(i).route for i in range(4)] == ["shared-memory"] * 2 + ["dask"] * 2
    assert [router.route(i) for i in range(4)] == ["shared-memory"] * 2 + ["dask"] * 2


def test_no_room_in_shared_memory_falls_back_to_dask():
    scatter, shm = RecordingTransport("dask"), RecordingTransport("shared-memory", room=False)
    router = WeightRouter(scatter, shm)
    router.publish(weights(1), [Target(0, "a", True)])
    assert scatter.sends == [(1, ["a"])] and router.pending(0).route == "dask"


def test_without_shared_memory_everything_goes_through_dask():
    scatter = RecordingTransport("dask")
    router = WeightRouter(scatter, None)
    router.publish(weights(1), [Target(0, "a", True), Target(1, "b", False)])
    assert scatter.sends == [(1, ["a", "b"])] and router.probe is None


def test_pending_until_a_rollout_reports_that_version(transports):
    router = WeightRouter(*transports)
    t = Target(0, "a", False)
    router.publish(weights(1), [t])
    router.loaded(0, 0)  # a call that started before the update
    assert router.pending(0).version == 1
    router.publish(weights(2), [t])
    router.loaded(0, 1)  # the older version arrived: the newer is still pending
    assert router.pending(0).version == 2
    router.loaded(0, 2)
    assert router.pending(0) is None


def test_versions_and_subsets(transports):
    router = WeightRouter(*transports)
    a, b = Target(0, "a", False), Target(1, "b", False)
    router.publish(weights(1), [a, b])
    router.publish(weights(2), [a])
    assert router.version == 2
    assert router.pending(0).version == 2 and router.pending(1).version == 1


def test_a_new_collector_adopts_its_index_weights_or_the_newest(transports):
    scatter, _ = transports
    router = WeightRouter(*transports)
    router.adopt(Target(0, "a", False))  # nothing published yet: built with its recipe's weights
    assert scatter.sends == []
    router.publish(weights(1), [Target(0, "a", False)])
    router.publish(weights(2), [Target(1, "b", False)])
    router.adopt(Target(0, "c", False))  # a replacement of collector 0 on worker c
    assert scatter.sends[-1] == (1, ["c"]) and router.pending(0).version == 1
    router.adopt(Target(5, "d", False))  # a new index: the newest weights
    assert scatter.sends[-1] == (2, ["d"])
    assert (router.pending(5).payload.weights["w"] == 2).all()


def test_stale_counts_batches_since_the_last_update(transports):
    router = WeightRouter(*transports)
    for _ in range(3):
        router.loaded(0, 0)
    router.loaded(1, 0)
    assert router.stale([0, 1], 2) == [0] and router.stale([0, 1], 0) == [0, 1]
    router.publish(weights(1), [Target(0, "a", False)])
    assert router.stale([0], 0) == []


def test_close_releases_everything(transports):
    scatter, shm = transports
    router = WeightRouter(scatter, shm)
    router.publish(weights(1), [Target(0, "a", True)])
    router.close(timeout=2.5)
    assert router.pending(0) is None and router.route(0) is None and shm.closed
    assert scatter.closed == 2.5  # the workers' copies are dropped within the caller's bound
