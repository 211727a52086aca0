"""The live set of collector actors: the slot table, calls in flight, completions.

The pool does what it is told and reports what happened; what to start, what
to replace and what to count is the engine's (:mod:`daskcollect.collection.engine`),
how an actor is built is :mod:`daskcollect.collection.build`'s.
Every wait is bounded by a timeout from :class:`~daskcollect.settings.Settings`.
A collector whose worker is gone (a failed call, a worker removed from the
scheduler) or whose rollout outran its timeout is reported as
:class:`CollectorLost`.

Two threads touch the table: the iteration thread (submits, completions) and
the client's event loop (completion callbacks, graceful retirement, see
:mod:`daskcollect.retirement.driver`). Every change to ``slots`` and to the calls in
flight happens under one lock.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from distributed import Client, wait

from daskcollect.collection.build import Slot, Target, collect_built, find_driver_host, submit_actors
from daskcollect.collection.polling import poll_until
from daskcollect.deploy.workers import eligible_workers, live_workers
from daskcollect.errors import CollectorTimeoutError, RolloutError
from daskcollect.settings import Settings
from daskcollect.streams.driver import CompletionStreams
from daskcollect.weights.payload import Sent
from daskcollect.worker.rollout import ActorSpec, Rollout

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class InFlight:
    """A rollout call that has not been consumed yet, and the weights it carries (kept alive).

    Attributes:
        outcome: ``(True, rollout)`` or ``(False, exception)`` once the call has
            finished (set on the client's event loop); ``None`` while it runs.
    """

    slot: Slot
    weights: Sent | None
    started: float = field(default_factory=time.monotonic)
    outcome: tuple[bool, Any] | None = None
    #: The oldest weights version the rollout can act with (the newest sent to its collector).
    version: int = 0

    def done(self) -> bool:
        return self.outcome is not None

    def result(self) -> Rollout:
        """The rollout of a finished call; raises what the call raised."""
        assert self.outcome is not None
        ok, value = self.outcome
        if ok:
            return value
        raise value


class CollectorLost(Exception):
    """A collector's actor is gone or stuck; the engine drops its calls and decides what follows.

    Attributes:
        slot: The collector.
        cause: What happened, for error messages.
        hung: ``True`` when a rollout outran its timeout (the worker is stuck).
        calls: Calls of the slot already taken out of flight (the failed one).
    """

    def __init__(self, slot: Slot, cause: str, hung: bool = False, calls: int = 0):
        super().__init__(cause)
        self.slot, self.cause, self.hung, self.calls = slot, cause, hung, calls


class ActorPool:
    """Starts, drives and closes one actor per worker.

    Args:
        client: Our ``Client(direct_to_workers=True)``.
        settings: The validated ``daskcollect`` settings.
        template: Every actor's :class:`~daskcollect.worker.rollout.ActorSpec`
            (``index``, ``uid`` and ``seed`` are filled in per actor).
        resources: Resources a worker must declare to host a collector.
    """

    def __init__(
        self,
        client: Client,
        settings: Settings,
        template: ActorSpec | None = None,
        resources: Mapping | None = None,
    ):
        self.client = client
        self.settings = settings
        self.template = template or ActorSpec(0, 0)
        self.resources = resources
        self._streams = CompletionStreams(
            client, self._answer, settings.timeouts.connect, same_host=settings.same_host_streams
        )
        self._calls: dict[int, deque[InFlight]] = {}  # per actor uid, in the order sent
        self._slots: list[Slot] = []
        self._next_uid = 0
        self._token = uuid.uuid4().hex[:8]
        #: The calls not consumed yet, in the order they were sent (a dict as an ordered set).
        self._inflight: dict[InFlight, None] = {}
        # Dask's as_completed does not wait for actor futures (its wait() sees no
        # Future in them and returns at once), so completions are tracked here.
        self._completed: queue.SimpleQueue[InFlight] = queue.SimpleQueue()
        self._unwatch: Callable[[], None] | None = None
        self.lock = threading.Lock()
        #: Addresses of workers announced as retiring (see daskcollect.retirement.driver).
        self.retiring_workers: set[str] = set()
        #: Workers that host no collector (central inference's servers).
        self.reserved: set[str] = set()
        self.census = ""  # what the last free_workers() saw, for NotEnoughWorkersError
        #: Awaited on the event loop when a call of a retiring slot completes.
        self.on_retiring_call_done: Callable[[Slot], Awaitable[None]] | None = None

    # --- the table ------------------------------------------------------------
    @property
    def slots(self) -> list[Slot]:
        """The live collectors, in index order (a snapshot)."""
        with self.lock:
            return list(self._slots)

    def sizes(self) -> dict[str, int]:
        """How many collectors' calls and streams are kept (a bound check for tests)."""
        with self.lock:
            calls = len(self._calls)
        return {"calls": calls, **self._streams.sizes()}

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    def slot(self, index: int) -> Slot | None:
        """The live slot of collector ``index`` (indices need not be contiguous after a shrink)."""
        with self.lock:
            return next((s for s in self._slots if s.index == index), None)

    def add(self, slots: list[Slot]) -> None:
        with self.lock:
            self._slots = sorted(self._slots + slots, key=lambda s: s.index)

    def remove(self, slot: Slot) -> int:
        """Drops ``slot``'s calls in flight and deletes its actor; returns the calls dropped."""
        with self.lock:
            dropped = [f for f in self._inflight if f.slot is slot]
            for flight in dropped:  # if one completes, next_completion ignores it
                self._inflight.pop(flight, None)
            slot.inflight = 0
            self._slots = [s for s in self._slots if s is not slot]
            self._calls.pop(slot.uid, None)
        self._streams.drop(slot.uid)
        with contextlib.suppress(Exception):
            self.client.cancel([slot.future])
        return len(dropped)

    def take_retired(self) -> list[Slot]:
        """Removes and returns the slots whose actor was released for a graceful retirement."""
        with self.lock:
            gone = [s for s in self._slots if s.retired]
            self._slots = [s for s in self._slots if not s.retired]
            for slot in gone:
                self._calls.pop(slot.uid, None)
        for slot in gone:
            self._streams.drop(slot.uid)
        return gone

    def mark_retiring(self, addresses: set[str], slots: list[Slot] | None = None) -> list[Slot]:
        """Takes note of workers about to retire: no call starts on their collectors from now on.

        Args:
            addresses: The workers announced.
            slots: The slots to look at (default: all live ones), e.g. new ones
                whose worker was announced while they were being built.

        Returns:
            The slots newly marked retiring.
        """
        with self.lock:
            self.retiring_workers |= addresses
            marked = [
                s
                for s in (self._slots if slots is None else slots)
                if s.address in self.retiring_workers and not s.retiring
            ]
            for slot in marked:
                slot.retiring = True  # submit() reads the flag under the lock
        return marked

    def claim_release(self, slot: Slot) -> bool:
        """Marks a retiring ``slot`` released if no call of it runs; ``False`` (nothing changed) otherwise."""
        running = {f.slot for f in self.running()}
        with self.lock:
            if slot.retired or slot in running:
                return False
            slot.retired = True
        return True

    def wait_released(self, timeout: float) -> None:
        """Waits (bounded) until every retiring slot with no call running has been released."""

        def settled() -> bool:
            busy = {f.slot for f in self.running()}
            return not any(s.retiring and not s.retired and s not in busy for s in self.slots)

        poll_until(settled, timeout, interval=0.02)

    def free_workers(self) -> list[str]:
        """Eligible workers that host none of our collectors and are not retiring."""
        with self.lock:
            hosting = {s.address for s in self._slots}
            retiring = set(self.retiring_workers)
        eligible = eligible_workers(self.client, self.resources, self.settings.timeouts.connect)
        listed, taken = set(eligible), hosting | retiring | self.reserved
        self.census = (
            f"the scheduler lists {len(eligible)} eligible workers: {len(hosting & listed)} host "
            f"this collection's collectors, {len(retiring & listed - hosting)} are retiring"
        )
        return [a for a in eligible if a not in taken]

    def live_workers(self) -> set[str]:
        """The workers the scheduler knows now (one bounded RPC)."""
        return live_workers(self.client, self.settings.timeouts.connect)

    def watch(self, events: Any) -> None:
        """Learns of workers removed from the scheduler's events
        (:class:`~daskcollect.membership.driver.ClusterEvents`), instead of asking it."""
        self._unwatch = events.on_leave(self._worker_left)

    def _worker_left(self, address: str) -> None:
        """A worker was removed (event loop): its collectors' calls complete as failed, and an address
        that comes back is no longer retiring."""
        with self.lock:
            self.retiring_workers.discard(address)
            uids = [s.uid for s in self._slots if s.address == address]
        for uid in uids:
            self._answer(uid, None, f"its worker {address} left the cluster")

    # --- start ------------------------------------------------------------
    def launch(self, todo: list[Target], seed: int | None = None) -> tuple[list[Slot], list[int]]:
        """One attempt to start actors: ``(index, recipe, address)`` each; nothing is added to the table.

        Returns:
            The slots built, and the indices whose worker left (or began
            retiring) meanwhile.

        Raises:
            CollectorBuildError: (or a subclass) if a collector fails to build.
            CollectorTimeoutError: If a collector is not built within
                ``daskcollect.timeouts.actor-start``.
        """
        usable = self._usable()
        lost = [i for i, _, a in todo if a not in usable]
        todo = [t for t in todo if t[0] not in lost]
        with self.lock:
            uids = list(range(self._next_uid, self._next_uid + len(todo)))
            self._next_uid += len(todo)
        try:
            futures = submit_actors(
                self.client, todo, uids, self.template, self._token, seed, self.settings.timeouts.weights
            )
        except (OSError, TimeoutError, KeyError) as exc:  # a target left (the scheduler no longer knows it)
            logger.info("could not send the recipe (%s: %s)", type(exc).__name__, exc)
            return [], lost + [t[0] for t in todo]
        try:
            slots, left = collect_built(
                self.client, todo, uids, futures, self.settings.timeouts.actor_start, self._usable
            )
        except BaseException:
            self.client.cancel(futures)
            raise
        self._opened(slots)
        return slots, lost + left

    def _usable(self) -> set[str]:
        """The workers that can host a collector now: known to the scheduler and not retiring."""
        alive = self.live_workers()
        with self.lock:
            return alive - self.retiring_workers

    def adopt(self, members: list[Any], recipes: dict[int, bytes]) -> list[Slot]:
        """Takes over the running actors of a collection whose driver died (:mod:`daskcollect.reattach.driver`).

        Each is rebound to this driver's :class:`ActorSpec` (weights' transports,
        output, labels) once the rollout it may still be running for the old
        driver ends; its envs and policy stay as they are. Nothing is added to
        the table.

        Args:
            members: :class:`~daskcollect.reattach.driver.Member` records.
            recipes: Per collector index, the recipe to start a replacement from.

        Returns:
            The slots taken over: the members whose worker is alive and whose
            actor answered within ``daskcollect.timeouts.rollout``.
        """
        alive = self.live_workers()
        found = [m for m in members if m.address in alive]
        with self.client.as_current():
            # A future from a dataset is "pending" until the scheduler reports its key to this client.
            with contextlib.suppress(TimeoutError):
                wait([m.future for m in found], timeout=self.settings.timeouts.call)
            found = [m for m in found if m.future.status == "finished"]
            actors = [(m, m.future.result(timeout=self.settings.timeouts.call)) for m in found]
        calls = [(m, actor, actor.rebind(self.template)) for m, actor in actors]
        slots = []
        for m, actor, call in calls:
            try:
                call.result(timeout=self.settings.timeouts.rollout)
            except Exception as exc:
                logger.warning("collector %d on %s could not be taken over (%s)", m.index, m.address, exc)
                continue
            slots.append(Slot(m.index, m.uid, m.address, m.future, actor, recipes.get(m.index, recipes[0])))
        self.reserve_uids(max((m.uid for m in members), default=-1) + 1)
        self._opened(slots)
        return slots

    def _opened(self, slots: list[Slot]) -> None:
        """Learns which new slots share the driver's host, and opens their completion streams."""
        if self.template.shared_memory is not None:
            find_driver_host(slots, self.settings.timeouts.call)
        self._streams.open([(s.uid, s.address, s.future.key, s.on_driver_host) for s in slots])

    # --- rollouts ----------------------------------------------------------
    def submit(self, slot: Slot, weights: Sent | None, version: int = 0) -> bool:
        """Queues a rollout on ``slot``'s stream, carrying ``weights`` when given (``version``: see
        :class:`InFlight`).

        Returns:
            ``False`` (nothing sent) if the slot's worker is retiring.
        """
        with self.lock:
            if slot.retiring:
                return False
            flight = InFlight(slot, weights, version=version)
            self._inflight[flight] = None
            slot.inflight += 1
            self._calls.setdefault(slot.uid, deque()).append(flight)
        self._streams.request(slot.uid, weights.ref if weights is not None else None)
        return True

    def _answer(self, uid: int, answer: tuple[bool, Any] | None, cause: str) -> None:
        """Finishes the oldest call of actor ``uid`` with ``answer``; all of them when its stream
        closed (``None``). Runs on the client's event loop, or the same-host channels' thread."""
        with self.lock:
            calls = self._calls.get(uid)
            if not calls:
                return  # a removed collector's
            done = [calls.popleft()] if answer is not None else [calls.popleft() for _ in range(len(calls))]
        if answer is None:
            answer = (False, OSError(f"Unable to contact Actor's worker: {cause}"))
        for flight in done:
            flight.outcome = answer
            self._completed.put(flight)
            slot = flight.slot
            if slot.retiring and self.on_retiring_call_done is not None:
                self.client.loop.add_callback(self.on_retiring_call_done, slot)

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def inflight_count(self, slot: Slot) -> int:
        """Rollout calls in flight on ``slot``."""
        return slot.inflight

    def inflight_versions(self) -> list[int]:
        """The oldest weights version of every call not consumed yet."""
        with self.lock:
            return [f.version for f in self._inflight]

    def running(self) -> list[InFlight]:
        """The calls still running on their workers (done ones wait to be consumed)."""
        with self.lock:
            flights = list(self._inflight)
        return [f for f in flights if not f.done()]

    def _check_stuck(self, timeout: float) -> float:
        """Raises :class:`CollectorLost` for a rollout that outran ``timeout``; else the seconds until
        the oldest one running could (``timeout`` when none runs)."""
        now = time.monotonic()
        with self.lock:  # the first call not done is the oldest running: calls start in order
            oldest = next((f for f in self._inflight if not f.done()), None)
        if oldest is None:
            return timeout
        if now - oldest.started > timeout:
            raise CollectorLost(
                oldest.slot,
                f"its rollout ran for more than {timeout:g}s (daskcollect.timeouts.rollout); "
                "an env may be stuck in step()",
                hung=True,
            )
        return oldest.started + timeout - now

    def next_completion(self, timeout: float) -> tuple[Slot, Rollout]:
        """Waits for the next finished rollout, in completion order.

        A collector whose worker leaves is learned from its stream closing and
        from the scheduler's worker events (:meth:`watch`): its calls then
        complete as failed. The wait wakes for a completion, or when the
        oldest rollout running outruns ``timeout``.

        Args:
            timeout: The bound on each rollout call, from its start.

        Raises:
            RolloutError: If the rollout raised on its worker.
            CollectorLost: If a collector's worker is gone or its rollout is stuck.
            CollectorTimeoutError: If no call is in flight and none completes within ``timeout``.
        """
        while True:
            try:
                flight = self._completed.get(timeout=max(self._check_stuck(timeout), 0.01))
            except queue.Empty:
                if not self._inflight:
                    raise CollectorTimeoutError(
                        f"No rollout call was in flight for {timeout:g}s: nothing can complete.", indices=[]
                    ) from None
                continue
            with self.lock:
                if flight not in self._inflight:
                    continue  # the call of a removed collector
                self._inflight.pop(flight, None)
                flight.slot.inflight -= 1
            try:
                out: Rollout = flight.result()
            except RolloutError:
                raise
            except Exception as exc:
                cause = f"its call failed ({type(exc).__name__}: {exc})"
                raise CollectorLost(flight.slot, cause, calls=1) from exc
            slot = flight.slot
            slot.frames += out.frames
            slot.seconds += out.seconds
            slot.rollouts += 1
            slot.policy_version = out.policy_version
            return slot, out

    def drain(self, timeout: float) -> None:
        """Waits (bounded) for calls in flight and discards their results."""
        deadline = time.monotonic() + timeout
        while self._inflight and time.monotonic() < deadline:
            try:
                self.next_completion(max(deadline - time.monotonic(), 0.01))
            except CollectorLost as lost:
                self.remove(lost.slot)
            except Exception:  # a failed rollout: nothing to keep
                pass

    def offer(self, offers: list[tuple[Slot, Sent]]) -> None:
        """Announces new weights to collectors, waiting (bounded) until each has them.

        The announcement runs on each worker's event loop, even mid-rollout,
        so the next rollout to start there uses these weights, whether its call
        was queued before or after. A worker that does not answer is left to
        its stream and the worker events.
        """
        calls = [(slot, slot.actor.offer_weights(sent.ref)) for slot, sent in offers]
        deadline = time.monotonic() + self.settings.timeouts.call
        for slot, call in calls:
            try:
                call.result(timeout=max(deadline - time.monotonic(), 0.01))
            except Exception as exc:
                logger.debug("collector %d did not take its weights (%s)", slot.index, exc)

    # --- other calls -------------------------------------------------------
    def reserve_uids(self, below: int) -> None:
        """Actors started from now on get uids of at least ``below`` (a resumed run's labels are taken)."""
        with self.lock:
            self._next_uid = max(self._next_uid, below)

    def call_all(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Calls ``method`` on every actor concurrently; results in index order."""
        timeout = self.settings.timeouts.call if timeout is None else timeout
        calls = [getattr(s.actor, method)(*args) for s in self.slots]
        return [c.result(timeout=timeout) for c in calls]

    def call(self, slot: Slot, method: str, *args: Any, timeout: float | None = None) -> Any:
        timeout = self.settings.timeouts.call if timeout is None else timeout
        return getattr(slot.actor, method)(*args).result(timeout=timeout)

    # --- close -------------------------------------------------------------
    def close(self, timeout: float) -> None:
        """Closes every actor's collector, then deletes the actors (bounded)."""
        if self._unwatch is not None:
            self._unwatch()
        self.drain(timeout / 2)
        deadline = time.monotonic() + timeout / 2
        slots = self.slots
        calls = []
        for slot in slots:
            with contextlib.suppress(Exception):
                calls.append(slot.actor.close())
        for call in calls:
            with contextlib.suppress(Exception):
                call.result(timeout=max(deadline - time.monotonic(), 0.01))
        with contextlib.suppress(Exception):
            self.client.cancel([s.future for s in slots])
        with self.lock:
            for slot in self._slots:
                slot.inflight = 0
            self._slots = []
            self._inflight.clear()
            self._calls.clear()
        self._streams.close(timeout / 2)
