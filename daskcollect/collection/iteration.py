"""The two ways to turn rollouts into batches, as TorchRL splits ``_multi_sync`` and ``_multi_async``.

- :class:`SyncIteration`: every collector gathers its share, and the batch is
  their stack ``[N, ...]`` (``MultiSyncCollector`` with ``cat_results="stack"``).
  A collector lost mid-batch is replaced and its share collected again, so the
  batch keeps its shape.
- :class:`AsyncIteration`: each batch is one collector's rollout, whichever
  finishes first; that collector is re-armed before the batch is yielded, so
  it keeps collecting while the driver trains.

Both only decide which collector to call next; starting, replacing and
counting belong to the :class:`~daskcollect.collection.engine.Engine`.
:class:`Progress` counts what the driver yielded (TorchRL's counters, the
pass, the positions a checkpoint takes), and :func:`batches` runs one
strategy for a pass. Runs on the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from daskcollect.collection.build import Slot
from daskcollect.collection.checkpoint import Yielded
from daskcollect.collection.engine import Engine, Lost
from daskcollect.scaling.driver import Demand
from daskcollect.worker.rollout import Rollout

#: Batches still to yield in this pass (``None``: endless).
Remaining = Callable[[], "int | None"]


class SyncIteration:
    """One rollout of every live collector per batch, in collector order."""

    def __init__(self, engine: Engine, remaining: Remaining):
        self.engine, self.remaining = engine, remaining

    def __iter__(self) -> Iterator[list[Rollout]]:
        engine = self.engine
        while (left := self.remaining()) is None or left > 0:
            engine.reconcile(wait_retired=True)
            slots = engine.pool.slots
            engine.refresh(slots)
            engine.wait_for_room(len(slots))
            # A collector whose worker is retiring takes no call (submit returns False).
            expected = {s.index for s in slots if engine.submit(s)}
            results: dict[int, Rollout] = {}
            while expected - results.keys():
                out = engine.next_rollout()
                if isinstance(out, Lost):
                    # Keep the batch shape: the replacement collects the lost share again.
                    if out.replacement is None or not engine.submit(out.replacement):
                        expected.discard(out.index)
                    continue
                results[out.index] = out
            if results:
                yield [results[i] for i in sorted(results)]


def lag_feasible(versions: list[int], now: int, bound: int, yields_before: int = 0) -> bool:
    """Whether rollouts of these weights versions can all be yielded within ``bound`` versions.

    Yielded oldest first, with at most one update per yield (as a training
    loop sends), the ``j``-th is yielded at version ``now + yields_before + j``
    at most.
    """
    return all(now + yields_before + j - v <= bound for j, v in enumerate(sorted(versions)))


class AsyncIteration:
    """Keeps ``depth`` rollout calls queued on each collector and yields them as they finish.

    With ``max_lag``, collectors are paced instead: a call starts only while
    every rollout outstanding can still be yielded within the bound, and a
    finished rollout waits while an older one still running must go first.
    Nothing is dropped.

    Args:
        engine: The engine.
        remaining: Batches still to yield in this pass.
        depth: Calls queued per collector (``daskcollect.async-depth``).
        max_lag: The bound on a yielded batch's policy lag, or ``None``.
    """

    def __init__(self, engine: Engine, remaining: Remaining, depth: int, max_lag: int | None = None):
        self.engine, self.remaining, self.depth, self.max_lag = engine, remaining, depth, max_lag
        self._ready: list[Rollout] = []  # finished, not yielded yet (with max_lag: waiting for an older one)

    def _arm(self, slots: list[Slot], held: int) -> None:
        """Queues calls round robin, but no more than the pass still needs, nor than memmap
        back-pressure allows (``held``: rollouts taken out but not yielded yet), nor than the
        lag bound allows."""
        pool, ledger = self.engine.pool, self.engine.ledger
        if pool.num_inflight >= self.depth * len(slots):
            return  # every collector has its calls queued: the usual case once running
        for _ in range(self.depth):
            for slot in slots:
                left = self.remaining()
                if left is not None and pool.num_inflight >= left - held:
                    return
                if ledger is not None and ledger.room(pool.num_inflight + held) <= 0:
                    return
                if pool.inflight_count(slot) < self.depth and self._lag_allows(slot):
                    self.engine.submit(slot)

    def _lag_allows(self, slot: Slot) -> bool:
        if self.max_lag is None:
            return True
        router = self.engine.router
        versions = self.engine.pool.inflight_versions() + [r.policy_version for r in self._ready]
        if not versions:
            return True  # nothing outstanding: frames must flow, even from a collector left behind
        return lag_feasible([*versions, router.sent_version(slot.index)], router.version, self.max_lag)

    def _pick(self, draining: bool = False) -> Rollout | None:
        """The finished rollout to yield now, or ``None``: wait for another.

        Without a lag bound, the first finished; with one, the oldest weights
        first, waiting while an older rollout still running must go first.
        ``draining`` (the pass is over): whatever is in, so that nothing is left.
        """
        if self.max_lag is None or draining:
            return self._ready[0] if self._ready else None
        now, ready = self.engine.router.version, sorted(self._ready, key=lambda r: r.policy_version)
        running = self.engine.pool.inflight_versions()
        for i, rollout in enumerate(ready):
            rest = [r.policy_version for r in ready[:i] + ready[i + 1 :]] + running
            late = now - rollout.policy_version > self.max_lag  # already past it: do not make it worse
            if late or lag_feasible(rest, now, self.max_lag, yields_before=1):
                return rollout
        return ready[0] if ready and not running else None

    def __iter__(self) -> Iterator[list[Rollout]]:
        engine, pool = self.engine, self.engine.pool
        engine.refresh([s for s in pool.slots if not pool.inflight_count(s)])
        while True:
            engine.reconcile()
            self._arm(pool.slots, held=len(self._ready))
            left = self.remaining()
            over = left is not None and left <= 0
            if over and not self._ready:
                return
            pick = self._pick(draining=over)
            if pick is None:
                if not pool.num_inflight:
                    engine.wait_for_room(1)  # every rollout is held by the caller: wait for releases
                    continue
                out = engine.next_rollout()
                if isinstance(out, Lost):
                    continue  # the loop re-arms the replacement
                self._ready.append(out)
                # Re-arm before yielding, so the collector works while the driver trains.
                slot = pool.slot(out.index)
                if slot is not None and not slot.retiring:
                    engine.refresh([slot])
                    self._arm([slot], held=len(self._ready))
                pick = self._pick()
                if pick is None:
                    continue  # with a lag bound: an older rollout still running goes first
            self._ready.remove(pick)
            yield [pick]


@dataclass
class Progress:
    """What the driver yielded: TorchRL's counters, the current pass, and each collector's last rollout.

    Attributes:
        frames: Frames yielded.
        iterations: Batches yielded, all passes together.
        pass_batches: Batches yielded in the current pass.
        resumed: Batches that a resumed checkpoint's pass had yielded (the next pass goes on from there).
        limit: Set to end the pass once the rollouts in flight are in.
        yielded: Per collector, its last rollout yielded (what a checkpoint resumes from).
    """

    frames: int = 0
    iterations: int = 0
    pass_batches: int = 0
    resumed: int = 0
    limit: int | None = None
    yielded: Yielded = field(default_factory=Yielded)

    def begin(self, fresh: bool) -> None:
        """Starts a pass: a fresh one, or (``fresh=False``) one that goes on where the last stopped or
        where the resumed checkpoint's stood."""
        if fresh:
            self.pass_batches, self.resumed = self.resumed, 0
        self.limit = None

    def remaining(self, num_batches: int | None) -> int | None:
        """Batches still to yield in this pass (``None``: endless)."""
        left = [x - self.pass_batches for x in (num_batches, self.limit) if x is not None]
        return min(left) if left else None

    def finish(self, inflight: int) -> None:
        """Ends the pass once the ``inflight`` rollouts are in (they are yielded, nothing is lost)."""
        self.limit = self.pass_batches + inflight

    def count(self, rollouts: list[Rollout]) -> None:
        """Counts a batch about to be yielded."""
        self.yielded.record(rollouts)
        self.iterations += 1
        self.pass_batches += 1
        self.frames += sum(r.frames for r in rollouts)

    def counters(self) -> dict[str, int]:
        """The counters a checkpoint keeps."""
        return {"frames": self.frames, "iterations": self.iterations, "pass_batches": self.pass_batches}

    def restore(self, state: dict[str, Any]) -> None:
        """Goes on from a checkpoint's counters."""
        self.frames, self.iterations, self.resumed = (
            state["frames"],
            state["iterations"],
            state["pass_batches"],
        )


def batches(
    engine: Engine,
    progress: Progress,
    depth: int,
    emit: Callable[[list[Rollout]], Any],
    report: Callable[[], None],
    demand: Demand | None = None,
) -> Iterator[Any]:
    """One pass of the collection's strategy: each batch counted, reported, then emitted.

    Args:
        engine: The engine.
        progress: The counters; their pass bound ends the pass.
        depth: Async mode's calls queued per collector (``daskcollect.async-depth``).
        emit: The output stage.
        report: Sends a throttled snapshot to the dashboard.
        demand: Told how long the learner held each batch (``None`` in the background, where
            nothing waits on a learner).
    """
    spec = engine.spec

    def remaining() -> int | None:
        return progress.remaining(spec.batch.num_batches)

    if spec.batch.sync:
        source: Any = SyncIteration(engine, remaining)
    else:
        source = AsyncIteration(engine, remaining, depth, spec.weights.max_policy_lag)
    for rollouts in source:
        progress.count(rollouts)
        report()
        held = time.monotonic()
        yield emit(rollouts)
        if demand is not None:
            demand.consumed(sum(r.frames for r in rollouts), time.monotonic() - held)
