"""The sync and async strategies in isolation, against a scripted engine."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import dask
import pytest
import torch
from makers import cartpole_policy, make_cartpole

from daskcollect import ConfigurationError, DaskCollector
from daskcollect.collection.engine import Lost
from daskcollect.collection.iteration import AsyncIteration, SyncIteration
from daskcollect.worker.rollout import Rollout


@dataclass(eq=False)
class FakeSlot:
    index: int
    retiring: bool = False


@dataclass
class FakePool:
    slots: list[FakeSlot]
    inflight: list[int] = field(default_factory=list)

    @property
    def num_inflight(self) -> int:
        return len(self.inflight)

    def inflight_count(self, slot) -> int:
        return self.inflight.count(slot.index)

    def slot(self, index):
        return next((s for s in self.slots if s.index == index), None)


class ScriptedEngine:
    """Completes calls in the order a script gives (collector indices, or Lost events)."""

    def __init__(self, n: int, script: list):
        self.pool = FakePool([FakeSlot(i) for i in range(n)])
        self.ledger = None
        self.script = deque(script)
        self.submitted: list[int] = []
        self.reconciled = 0

    def reconcile(self, wait_retired: bool = False) -> None:
        self.reconciled += 1

    def refresh(self, slots) -> None:
        pass

    def wait_for_room(self, needed: int) -> None:
        pass

    def submit(self, slot) -> bool:
        self.submitted.append(slot.index)
        self.pool.inflight.append(slot.index)
        return True

    def next_rollout(self):
        event = self.script.popleft()
        if isinstance(event, Lost):
            self.pool.inflight.remove(event.index)
            return event
        self.pool.inflight.remove(event)
        return Rollout(event, event, 0, 0, 0.0, 0.0, batch=torch.zeros(1), frames=10)


class Counter:
    """The collector's ``_remaining``: batches left in the pass."""

    def __init__(self, batches: int | None):
        self.left = batches

    def __call__(self):
        return self.left

    def take(self, iterable):
        out = []
        for item in iterable:
            out.append(item)
            if self.left is not None:
                self.left -= 1
        return out


def test_sync_stacks_in_collector_order_whatever_the_completion_order():
    engine = ScriptedEngine(3, [2, 0, 1, 1, 2, 0])
    counter = Counter(2)
    batches = counter.take(SyncIteration(engine, counter))
    assert [[r.index for r in b] for b in batches] == [[0, 1, 2], [0, 1, 2]]
    assert engine.submitted == [0, 1, 2, 0, 1, 2] and engine.reconciled == 2


def test_sync_recollects_a_lost_share_on_the_replacement():
    replacement = FakeSlot(1)
    engine = ScriptedEngine(2, [0, Lost(1, replacement), 1])
    counter = Counter(1)
    (batch,) = counter.take(SyncIteration(engine, counter))
    assert [r.index for r in batch] == [0, 1]  # the batch kept its shape
    assert engine.submitted == [0, 1, 1]


def test_sync_goes_on_without_a_collector_that_was_not_replaced():
    engine = ScriptedEngine(2, [Lost(0, None), 1])
    counter = Counter(1)
    (batch,) = counter.take(SyncIteration(engine, counter))
    assert [r.index for r in batch] == [1]


def test_async_keeps_depth_calls_per_collector_and_yields_in_completion_order():
    engine = ScriptedEngine(2, [1, 0, 1, 0, 0, 1])
    counter = Counter(6)
    batches = counter.take(AsyncIteration(engine, counter, depth=2))
    assert [b[0].index for b in batches] == [1, 0, 1, 0, 0, 1]
    assert engine.submitted[:4] == [0, 1, 0, 1]  # round robin, two deep
    assert len(engine.submitted) == 6 and not engine.pool.inflight  # never more calls than batches


def test_async_never_queues_more_than_the_pass_needs():
    engine = ScriptedEngine(4, [0, 1])
    counter = Counter(2)
    batches = counter.take(AsyncIteration(engine, counter, depth=2))
    assert len(batches) == 2 and engine.submitted == [0, 1]


def test_async_skips_lost_rollouts_and_rearms():
    engine = ScriptedEngine(1, [Lost(0, FakeSlot(0)), 0, 0])
    counter = Counter(2)
    batches = counter.take(AsyncIteration(engine, counter, depth=1))
    assert [b[0].index for b in batches] == [0, 0] and engine.submitted == [0, 0, 0]


def test_lag_feasible_yields_oldest_first_one_update_each():
    from daskcollect.collection.iteration import lag_feasible

    assert lag_feasible([5, 5], now=5, bound=1)  # yielded at 5 then 6: lags 0 and 1
    assert not lag_feasible([5, 5, 5], now=5, bound=1)  # the third would be 2 behind
    assert not lag_feasible([4], now=5, bound=1, yields_before=1)  # another batch first: 2 behind
    assert lag_feasible([3, 6], now=6, bound=3)


@pytest.mark.parametrize("bound", [None, 1])
def test_max_policy_lag_paces_the_collectors_and_drops_nothing(client, bound):
    """Two collectors with two calls queued each, one update per batch: unbounded, batches fall two or
    more versions behind; with max_policy_lag=1, none does, and every frame still arrives once."""
    lags, batches = [], []
    with dask.config.set({"daskcollect.async-depth": 2}):
        with DaskCollector(make_cartpole, cartpole_policy(), frames_per_batch=20, total_frames=20 * 40,
                           num_collectors=2, track_policy_version=True, max_policy_lag=bound,
                           client=client) as collector:  # fmt: skip
            for batch in collector:
                lags.append(collector.policy_version - int(batch["policy_version"].max()))
                batches.append(batch)
                collector.update_policy_weights_()
    assert sum(b.numel() for b in batches) == 20 * 40
    pairs = {(int(b["collector", "collector_id"][0]), int(b["collector", "rollout_id"][0])) for b in batches}
    assert len(pairs) == len(batches)
    if bound is None:
        assert max(lags) >= 2, lags
    else:
        assert max(lags) <= bound, lags


def test_max_policy_lag_must_be_a_positive_int():
    with pytest.raises(ConfigurationError, match="sync=True"):
        DaskCollector(make_cartpole, frames_per_batch=20, max_policy_lag=0, client="tcp://127.0.0.1:9")
