"""``Engine.reconcile`` and the start/replace paths against a small fake pool (no cluster)."""

from __future__ import annotations

import itertools

import dask
import pytest
from helpers import collector_keywords

from daskcollect import NotEnoughWorkersError
from daskcollect.collection.build import Slot
from daskcollect.collection.engine import Engine
from daskcollect.collection.spec import CollectionSpec
from daskcollect.settings import Settings
from daskcollect.weights.router import WeightRouter

_uids = itertools.count()


class FakePool:
    """The slot table of ActorPool, with workers that come and go by hand."""

    def __init__(self, workers: list[str]):
        self.workers = list(workers)
        self._slots: list[Slot] = []
        self.launched: list[list[tuple[int, str]]] = []
        self.leave_during_start: set[str] = set()
        self.retiring_workers: set[str] = set()
        self.census = "what the fake saw"

    def live_workers(self) -> set[str]:
        return set(self.workers)

    def free_workers(self) -> list[str]:
        taken = {s.address for s in self._slots}
        return [w for w in sorted(self.workers) if w not in taken]

    @property
    def slots(self) -> list[Slot]:
        return list(self._slots)

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    def launch(self, todo, seed=None):
        self.launched.append([(i, a) for i, _, a in todo])
        slots, lost = [], []
        for index, recipe, address in todo:
            if address in self.leave_during_start:
                self.workers.remove(address)
                lost.append(index)
            else:
                slots.append(Slot(index, next(_uids), address, None, None, recipe))
        return slots, lost

    def add(self, slots):
        self._slots = sorted(self._slots + slots, key=lambda s: s.index)

    def take_retired(self):
        gone = [s for s in self._slots if s.retired]
        self._slots = [s for s in self._slots if not s.retired]
        return gone


class FakeWatcher:
    def __init__(self, pool):
        self.pool = pool

    def take_retired(self, wait):
        return self.pool.take_retired()

    def adopt(self, slots):
        pass


class NoTransport:
    route, probe = "dask", None

    def close(self):
        pass


def keywords(**overrides) -> dict:
    return collector_keywords(**overrides)


def engine(workers: list[str], n: int | None, **overrides) -> tuple[Engine, FakePool]:
    """An engine over a fake pool; ``n=None`` follows the cluster (2 collectors to start)."""
    with dask.config.set({"daskcollect.timeouts.workers": "0.5s"}):
        settings = Settings.load()
    spec = CollectionSpec.from_keywords(settings, keywords(num_collectors=n, **overrides))
    n = 2 if n is None else n
    pool = FakePool(workers)
    router = WeightRouter(NoTransport(), None)
    out = Engine(
        None, spec, settings, n, [b"recipe"] * n, pool=pool, router=router, watcher=FakeWatcher(pool)
    )
    return out, pool


def placement(pool: FakePool) -> dict[int, str]:
    return {s.index: s.address for s in pool.slots}


def test_start_places_one_collector_per_free_worker_in_order():
    eng, pool = engine(["w1", "w2", "w3"], 2)
    eng.start()
    assert placement(pool) == {0: "w1", 1: "w2"}
    assert pool.launched == [[(0, "w1"), (1, "w2")]]


def test_start_retries_a_collector_whose_worker_left_on_another_free_worker():
    eng, pool = engine(["w1", "w2", "w3"], 2)
    pool.leave_during_start = {"w2"}
    eng.start()
    assert placement(pool) == {0: "w1", 1: "w3"}


def test_start_fails_fast_and_clearly_without_enough_workers():
    eng, _ = engine(["w1"], 2)
    with pytest.raises(
        NotEnoughWorkersError, match=r"Needed 2 workers .* found 1 free .*\(what the fake saw\)"
    ):
        eng.start()


def test_reconcile_does_nothing_when_desired_equals_live():
    eng, pool = engine(["w1", "w2"], 2)
    eng.start()
    eng.reconcile()
    assert len(pool.launched) == 1


def test_reconcile_brings_back_a_missing_index_on_a_free_worker():
    eng, pool = engine(["w1", "w2", "w3"], 2)
    eng.start()
    pool._slots = [s for s in pool._slots if s.index != 1]  # collector 1 went with its worker
    pool.workers.remove("w2")
    eng.reconcile()
    assert placement(pool) == {0: "w1", 1: "w3"}


def test_reconcile_counts_retired_collectors_and_replaces_them():
    eng, pool = engine(["w1", "w2", "w3"], 2)
    eng.start()
    pool.slots[0].retired = True
    pool.workers.remove("w1")
    eng.reconcile()
    assert eng.failures.retired == 1 and placement(pool) == {0: "w3", 1: "w2"}


def test_following_the_cluster_gives_each_joining_worker_a_collector():
    eng, pool = engine(["w1", "w2"], None, client="tcp://127.0.0.1:1")
    assert eng.spec.follow
    eng.start()
    eng.reconcile()
    assert len(pool.launched) == 1  # no new worker: nothing to do
    pool.workers += ["w3", "w4"]
    eng.reconcile()
    assert placement(pool) == {0: "w1", 1: "w2", 2: "w3", 3: "w4"}


def test_with_no_collector_left_reconcile_waits_then_fails_with_the_fix():
    eng, pool = engine(["w1"], 1)
    eng.start()
    pool._slots, pool.workers = [], []
    with pytest.raises(NotEnoughWorkersError, match="raise daskcollect.timeouts.workers"):
        eng.reconcile()
