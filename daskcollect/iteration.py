"""The two ways to turn rollouts into batches, as TorchRL splits ``_multi_sync`` and ``_multi_async``.

- :class:`SyncIteration`: every collector gathers its share, and the batch is
  their stack ``[N, ...]`` (``MultiSyncCollector`` with ``cat_results="stack"``).
  A collector lost mid-batch is replaced and its share collected again, so the
  batch keeps its shape.
- :class:`AsyncIteration`: each batch is one collector's rollout, whichever
  finishes first; that collector is re-armed before the batch is yielded, so
  it keeps collecting while the driver trains.

Both only decide which collector to call next; starting, replacing and
counting belong to the :class:`~daskcollect.engine.Engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from daskcollect.engine import Engine, Lost
from daskcollect.pool import Slot
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
