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


class AsyncIteration:
    """Keeps ``depth`` rollout calls queued on each collector and yields them as they finish.

    Args:
        engine: The engine.
        remaining: Batches still to yield in this pass.
        depth: Calls queued per collector (``daskcollect.async-depth``).
    """

    def __init__(self, engine: Engine, remaining: Remaining, depth: int):
        self.engine, self.remaining, self.depth = engine, remaining, depth

    def _arm(self, slots: list[Slot], held: int) -> None:
        """Queues calls round robin, but no more than the pass still needs, nor than memmap
        back-pressure allows (``held``: rollouts taken out but not yielded yet)."""
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
                if pool.inflight_count(slot) < self.depth:
                    self.engine.submit(slot)

    def __iter__(self) -> Iterator[list[Rollout]]:
        engine, pool = self.engine, self.engine.pool
        engine.refresh([s for s in pool.slots if not pool.inflight_count(s)])
        while True:
            engine.reconcile()
            self._arm(pool.slots, held=0)
            left = self.remaining()
            if left is not None and left <= 0:
                return
            if not pool.num_inflight:
                engine.wait_for_room(1)  # every rollout is held by the caller: wait for releases
                continue
            out = engine.next_rollout()
            if isinstance(out, Lost):
                continue  # the loop re-arms the replacement
            # Re-arm before yielding, so the collector works while the driver trains.
            slot = pool.slot(out.index)
            if slot is not None and not slot.retiring:
                engine.refresh([slot])
                self._arm([slot], held=1)
            yield [out]
