"""The live set of collector actors: placement, start, calls in flight, loss, replacement, close.

Failure handling lives here, not in the iteration code: every wait is bounded
by a timeout from :mod:`daskcollect.config`; a collector whose worker is gone
(failed call, worker removed from the scheduler) or whose rollout outran its
timeout is reported as :class:`CollectorLost`, its calls in flight are dropped
whole, and :meth:`ActorPool.replace` starts a new incarnation elsewhere.

A worker that retires gracefully is announced by the scheduler plugin of
:mod:`daskcollect.retirement`. Its collector gets no new calls, finishes those
in flight (their batches are kept), is closed and released on the client's
event loop, and is then handed to the iteration code by :meth:`ActorPool.take_retired`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distributed import Client, Future, wait
from distributed.actor import Actor, BaseActorFuture
from distributed.client import FuturesCancelledError

from daskcollect import config
from daskcollect.actor import ActorSpec, CollectorActor, Rollout
from daskcollect.cluster import eligible_workers, live_workers
from daskcollect.errors import (
    CollectorBuildError,
    CollectorTimeoutError,
    DaskCollectError,
    NotEnoughWorkersError,
    RolloutError,
)
from daskcollect.retirement import ACTOR_KEY_PREFIX, TOPIC
from daskcollect.sharedmem import SharedWeights, SharedWeightsDir
from daskcollect.weights import WeightsPayload, WeightsRef

logger = logging.getLogger(__name__)

#: What keeps sent weights alive until no one needs them: their Dask future, or
#: their shared-memory file. Both give the payload back with ``result(timeout)``.
Held = Future | SharedWeights


@dataclass
class Slot:
    """One collector: its actor and what the driver knows about it.

    Attributes:
        index: The collector's position (0..num_collectors-1).
        uid: The actor incarnation (namespaces trajectory ids).
        address: The worker hosting the actor.
        future: The actor's task future; releasing it deletes the actor.
        actor: The actor proxy.
        recipe: The cloudpickled recipe, kept to start a replacement.
        pending: Newer weights to send with the next rollout call, kept alive
            with their future until a call carrying them completes.
        batches_since_update: Batches produced since the last weights update.
        frames: Frames this slot delivered, and ``seconds`` the rollouts took.
        rollouts: Rollouts this slot delivered; ``policy_version`` the weights
            version of the last one.
        retiring: Its worker is retiring gracefully: no new calls.
        retired: Its actor has been closed and released.
        local: Its worker reads weights from the driver's shared memory.
    """

    index: int
    uid: int
    address: str
    future: Future
    actor: Actor
    recipe: bytes
    pending: tuple[WeightsRef, Held] | None = None
    batches_since_update: int = 0
    frames: int = 0
    seconds: float = 0.0
    rollouts: int = 0
    policy_version: int = 0
    retiring: bool = False
    retired: bool = False
    local: bool = False


@dataclass
class InFlight:
    """A rollout call that has not been consumed yet."""

    slot: Slot
    call: BaseActorFuture
    weights: tuple[WeightsRef, Held] | None
    started: float = field(default_factory=time.monotonic)


class _FailedCall(BaseActorFuture):
    """A rollout call that could not even be sent; its result raises why."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def result(self, timeout=None):
        raise self.exc

    def done(self) -> bool:
        return True

    def __await__(self):
        raise self.exc
        yield  # pragma: no cover


class CollectorLost(Exception):
    """Internal signal: a collector's actor is gone or stuck; its calls are dropped.

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
    """Starts, drives, replaces and closes one actor per worker.

    Args:
        client: Our ``Client(direct_to_workers=True)``.
        spec: Template for every actor's :class:`~daskcollect.actor.ActorSpec`
            (``index`` and ``uid`` are filled in per actor).
        resources: Resources a worker must declare to host a collector.
    """

    def __init__(self, client: Client, spec: ActorSpec | None = None, resources: Mapping | None = None):
        self.client = client
        self.spec = spec or ActorSpec(0, 0)
        self.resources = resources
        self.slots: list[Slot] = []
        self._uids = itertools.count()
        self._token = uuid.uuid4().hex[:8]
        self._inflight: dict[BaseActorFuture, InFlight] = {}
        # Dask's as_completed does not wait for actor futures (its wait() sees no
        # Future in them and returns at once), so completions are tracked here.
        self._completed: queue.SimpleQueue[BaseActorFuture] = queue.SimpleQueue()
        self._next_liveness = 0.0
        # The latest weights sent to each collector index, and to anyone, for new actors.
        self._latest: dict[int, tuple[WeightsRef, Held]] = {}
        self._newest: tuple[WeightsRef, Held] | None = None
        self._recipes: dict[int, bytes] = {}
        # Weights for collectors on this host go through shared memory (None: off).
        self._shm = SharedWeightsDir.create()
        # Graceful retirement: the event loop thread marks and releases slots,
        # the iteration thread submits calls; this lock orders the two.
        self._lock = threading.Lock()
        self.retiring: set[str] = set()
        client.subscribe_topic(TOPIC, self._on_retiring)

    # --- start -------------------------------------------------------------
    def _launch(
        self, indices: list[int], recipes: list[bytes], addresses: list[str], seed=None, retry: bool = True
    ) -> list[Slot]:
        """Starts actors and waits (bounded) until they are built.

        A worker that leaves (or starts retiring) while its collector is being
        built costs only that attempt: with ``retry``, the collector is started
        again on a free worker, within ``daskcollect.timeouts.workers``;
        without, it is left out of the result.

        Raises:
            NotEnoughWorkersError: If no free worker takes over within that time.
        """
        timeout = config.timeout("workers")
        deadline = time.monotonic() + timeout
        slots: list[Slot] = []
        while True:
            new, lost = self._launch_once(indices, recipes, addresses, seed)
            slots += new
            if not lost or not retry:
                return slots
            logger.info("collectors %s lost their workers while starting; starting them elsewhere", lost)
            pairs = [(i, r) for i, r in zip(indices, recipes) if i in lost]
            indices, recipes = [i for i, _ in pairs], [r for _, r in pairs]
            used = {s.address for s in slots}
            while len(free := [a for a in self.free_workers() if a not in used]) < len(indices):
                if time.monotonic() > deadline:
                    raise NotEnoughWorkersError(
                        f"Workers left while collectors {indices} were being started, and no free eligible "
                        f"worker took their place within {timeout:g}s. Start more workers, or raise "
                        "daskcollect.timeouts.workers.",
                        needed=len(indices),
                        found=len(free),
                    )
                time.sleep(0.2)
            addresses = free[: len(indices)]

    def _launch_once(
        self, indices: list[int], recipes: list[bytes], addresses: list[str], seed=None
    ) -> tuple[list[Slot], list[int]]:
        """One attempt: the slots built, and the indices whose worker left meanwhile."""
        alive = live_workers(self.client)
        lost = [i for i, a in zip(indices, addresses) if a not in alive or a in self.retiring]
        todo = [(i, r, a) for i, r, a in zip(indices, recipes, addresses) if i not in lost]
        # Each distinct recipe is sent once, to the workers that build from it.
        blobs: dict[bytes, Future] = {}
        try:
            for _, recipe, _ in todo:
                if recipe not in blobs:
                    targets = sorted({a for _, r, a in todo if r == recipe})
                    # One copy; the other targets fetch it from there when they build.
                    blobs[recipe] = self.client.scatter(
                        recipe, workers=targets, hash=False, direct=True, timeout=config.timeout("weights")
                    )
        except (OSError, TimeoutError) as exc:  # a target left: this attempt is lost
            logger.info("could not send the recipe (%s: %s)", type(exc).__name__, exc)
            return [], list(indices)
        futures, uids = [], []
        for index, recipe, address in todo:
            uid = next(self._uids)
            spec = ActorSpec(
                index, uid, self.spec.track_policy_version, self.spec.memmap_root,
                self.spec.restart_env_on_error, seed, self._shm.probe if self._shm else None,
            )  # fmt: skip
            uids.append(uid)
            futures.append(
                self.client.submit(
                    CollectorActor,
                    spec,
                    blobs[recipe],
                    actor=True,
                    workers=[address],
                    allow_other_workers=False,
                    pure=False,
                    key=f"{ACTOR_KEY_PREFIX}{self._token}-{uid}",
                )
            )
        timeout = config.timeout("actor-start")
        try:
            with self.client.as_current():
                wait(futures, timeout=timeout, return_when="ALL_COMPLETED")
        except (TimeoutError, FuturesCancelledError):
            pass  # sorted out below, future by future
        try:
            alive = live_workers(self.client)
            slots, late = [], []
            for (index, recipe, address), uid, future in zip(todo, uids, futures):
                if future.status == "error":
                    exc = future.exception()
                    if isinstance(exc, DaskCollectError):
                        raise exc  # ours, raised on the worker: it names the cause already
                    raise CollectorBuildError(
                        f"A collector could not be started on {address}: {type(exc).__name__}: "
                        f"{exc}. Check that daskcollect, torch and torchrl are installed on the "
                        "workers in the same versions as here."
                    ) from exc
                if future.status == "finished":
                    with self.client.as_current():
                        actor = future.result(timeout=timeout)
                    slots.append(Slot(index, uid, address, future, actor, recipe))
                elif address not in alive or address in self.retiring or future.status != "pending":
                    lost.append(index)  # its worker left (or is leaving) during the start
                    self.client.cancel([future])
                else:
                    late.append(index)
            if late:
                raise CollectorTimeoutError(
                    f"Collectors {late} were not built within {timeout:g}s. Building envs "
                    "and policy on the workers is too slow or stuck: check the env "
                    "constructor, or raise daskcollect.timeouts.actor-start.",
                    indices=late,
                )
            self._adopt_retiring(slots)
            self._find_local(slots)
            return slots, lost
        except BaseException:
            self.client.cancel(futures)
            raise

    @property
    def shares_memory(self) -> bool:
        """Whether weights can go through this host's shared memory (then ``Slot.local`` is known)."""
        return self._shm is not None

    def _find_local(self, slots: list[Slot]) -> None:
        """Marks the slots whose worker reads the driver's shared memory (asked once, bounded)."""
        if self._shm is None:
            return
        calls = [(slot, slot.actor.shares_driver_memory()) for slot in slots]
        for slot, call in calls:
            try:
                slot.local = bool(call.result(timeout=config.timeout("call")))
            except Exception as exc:  # its worker is leaving: the rollout path will tell
                logger.debug("collector %d: no answer on shared memory (%s)", slot.index, exc)

    def start(self, recipes: list[bytes], addresses: list[str]) -> None:
        """Starts one actor per recipe, the i-th on ``addresses[i]``.

        Raises:
            CollectorBuildError: (or a subclass) if a collector fails to build.
            CollectorTimeoutError: If a collector is not built within
                ``daskcollect.timeouts.actor-start``.
        """
        self._recipes = dict(enumerate(recipes))
        self.slots = self._launch(list(range(len(recipes))), recipes, addresses)

    def slot(self, index: int) -> Slot | None:
        """The live slot of collector ``index`` (indices need not be contiguous after a shrink)."""
        return next((s for s in self.slots if s.index == index), None)

    def free_workers(self) -> list[str]:
        """Eligible workers that host none of our collectors and are not retiring."""
        taken = {s.address for s in self.slots} | self.retiring
        return [a for a in eligible_workers(self.client, self.resources) if a not in taken]

    def replace(self, lost: Slot, seed: int | None = None) -> Slot:
        """Starts a new incarnation of ``lost`` on a free eligible worker (bounded wait).

        The new actor keeps the collector index, gets a new uid (fresh
        trajectory ids), and loads the latest weights sent to that index
        before its first rollout.

        Raises:
            NotEnoughWorkersError: If no free eligible worker appears within
                ``daskcollect.timeouts.workers``.
        """
        timeout = config.timeout("workers")
        deadline = time.monotonic() + timeout
        while not (free := self.free_workers()):
            if time.monotonic() >= deadline:
                raise NotEnoughWorkersError(
                    f"Collector {lost.index} lost its worker and no free eligible worker joined within "
                    f"{timeout:g}s to host a replacement. Add workers, or raise daskcollect.timeouts.workers.",
                    needed=1,
                    found=0,
                )
            time.sleep(0.2)
        (slot,) = self._launch([lost.index], [lost.recipe], [free[0]], seed)
        self._send_latest_weights(slot)
        self.slots = sorted([s for s in self.slots if s is not lost] + [slot], key=lambda s: s.index)
        return slot

    def grow(self, addresses: list[str], indices: list[int] | None = None) -> list[Slot]:
        """Starts collectors on ``addresses``.

        Args:
            addresses: One worker per new collector.
            indices: Their collector indices (their own recipes); by default new
                indices after the highest, with collector 0's recipe.
        """
        if not addresses or not self._recipes:
            return []
        if indices is None:
            start = max(self._recipes) + 1
            indices = list(range(start, start + len(addresses)))
        recipes = [self._recipes.get(i, self._recipes[0]) for i in indices]
        new = self._launch(indices, recipes, addresses, retry=False)
        self._recipes.update((s.index, s.recipe) for s in new)
        for slot in new:
            self._send_latest_weights(slot)
        self.slots = sorted(self.slots + new, key=lambda s: s.index)
        return new

    def _send_latest_weights(self, slot: Slot) -> None:
        """Gives a new actor the latest weights sent to its index (or to anyone)."""
        latest = self._latest.get(slot.index) or self._newest
        if latest is not None:
            # Gathered and scattered again: their replicas may have died with the old worker.
            payload = latest[1].result(timeout=config.timeout("weights"))
            self.scatter_weights(payload, [slot])

    def abandon(self, slot: Slot) -> int:
        """Drops ``slot``'s calls in flight and deletes its actor; returns the calls dropped."""
        dropped = [c for c, f in self._inflight.items() if f.slot is slot]
        for call in dropped:
            del self._inflight[call]  # if it ever completes, next_rollout ignores it
        with contextlib.suppress(Exception):
            self.client.cancel([slot.future])
        self.slots = [s for s in self.slots if s is not slot]
        return len(dropped)

    # --- weights -----------------------------------------------------------
    def scatter_weights(self, payload: WeightsPayload, slots: list[Slot]) -> tuple[WeightsRef, Held] | None:
        """Sends ``payload`` to ``slots``, its bytes written once per route.

        Collectors on the driver's host get it through shared memory (one
        write, no transfer); the others through one Dask scatter, replicated
        between their workers by Dask. Each slot sends the reference with its
        next rollout call.

        Returns:
            The last reference made (``None`` without slots).
        """
        if not slots:
            return None
        routes: list[tuple[tuple[WeightsRef, Held], list[Slot]]] = []
        local = [s for s in slots if s.local]
        shared = self._shm.write(payload) if local and self._shm is not None else None
        if shared is not None:
            routes.append(((shared.ref(), shared), local))
        remote = [s for s in slots if shared is None or not s.local]
        if remote:
            addresses = sorted({s.address for s in remote})
            future = self.client.scatter(
                payload,
                workers=addresses,
                broadcast=len(addresses) > 1,
                hash=False,
                direct=True,
                timeout=config.timeout("weights"),
            )
            routes.append(((WeightsRef(future.key, payload.version), future), remote))
        for pending, targets in routes:
            if self._newest is None or payload.version >= self._newest[0].version:
                self._newest = pending
            for slot in targets:
                slot.pending = self._latest[slot.index] = pending
                slot.batches_since_update = 0
        return pending

    # --- rollouts ----------------------------------------------------------
    def submit_rollout(self, slot: Slot) -> bool:
        """Starts a rollout on ``slot`` (weights included when newer ones are pending).

        Returns:
            ``False`` (nothing sent) if the slot's worker is retiring.
        """
        pending = slot.pending
        with self._lock:
            if slot.retiring:
                return False
            try:
                call = slot.actor.rollout(pending[0] if pending else None)
            except Exception as exc:  # e.g. "Worker holding Actor was lost": report it as a failed call
                call = _FailedCall(exc)
                self._inflight[call] = InFlight(slot, call, pending)
                self._completed.put(call)
                return True
            self._inflight[call] = InFlight(slot, call, pending)
        self.client.loop.add_callback(self._watch, call, slot)
        return True

    async def _watch(self, call: BaseActorFuture, slot: Slot) -> None:
        """Runs on the client's event loop: queues ``call`` once it has finished."""
        with contextlib.suppress(BaseException):
            await call
        self._completed.put(call)
        if slot.retiring:
            await self._release_if_idle(slot)

    # --- graceful retirement (client event loop) ---------------------------------
    async def _on_retiring(self, event: tuple[float, dict]) -> None:
        """Handles the scheduler plugin's announcement of workers about to retire."""
        _, msg = event
        addresses = set(msg.get("workers", ()))
        with self._lock:
            self.retiring |= addresses
            slots = [s for s in self.slots if s.address in addresses]
            for slot in slots:
                slot.retiring = True
        for slot in slots:
            await self._release_if_idle(slot)

    def _adopt_retiring(self, slots: list[Slot]) -> None:
        """Marks new slots whose worker began retiring while they were being built."""
        with self._lock:
            late = [s for s in slots if s.address in self.retiring]
            for slot in late:
                slot.retiring = True
        for slot in late:
            self.client.loop.add_callback(self._release_if_idle, slot)

    async def _release_if_idle(self, slot: Slot) -> None:
        """Closes and releases a retiring slot's actor once no call of it runs."""
        with self._lock:
            running = any(f.slot is slot for f in self._running())
            if slot.retired or running:
                return
            slot.retired = True
        try:
            await asyncio.wait_for(slot.actor.close(), config.timeout("call"))
        except Exception as exc:  # the worker may already be closing: releasing is what matters
            logger.debug("closing retiring collector %d: %s", slot.index, exc)
        await self.client._cancel([slot.future], reason="daskcollect: worker retiring")
        logger.info("collector %d released: its worker %s is retiring", slot.index, slot.address)

    def take_retired(self, wait: bool) -> list[Slot]:
        """Removes and returns the slots released for a graceful retirement.

        Args:
            wait: Also wait (bounded) for retiring slots with no call running
                to be released, so that none is left half-way (sync mode).
        """
        deadline = time.monotonic() + config.timeout("call")
        while wait and time.monotonic() < deadline:
            with self._lock:
                busy = {f.slot for f in self._running()}
                waiting = [s for s in self.slots if s.retiring and not s.retired and s not in busy]
            if not waiting:
                break
            time.sleep(0.02)
        with self._lock:
            gone = [s for s in self.slots if s.retired]
            self.slots = [s for s in self.slots if not s.retired]
        return gone

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def _running(self) -> list[InFlight]:
        """The calls still running on their workers (done ones wait to be consumed)."""
        return [f for f in list(self._inflight.values()) if not f.call.done()]

    def busy_slots(self) -> set[int]:
        """Indices of the collectors with a rollout running now."""
        return {f.slot.index for f in self._running()}

    def inflight_count(self, slot: Slot) -> int:
        """Rollout calls in flight on ``slot``."""
        return sum(f.slot is slot for f in self._inflight.values())

    def _check_liveness(self, timeout: float) -> None:
        """Raises :class:`CollectorLost` for a stuck rollout or a worker gone from the scheduler."""
        now = time.monotonic()
        running = self._running()
        for flight in running:
            if now - flight.started > timeout:
                raise CollectorLost(
                    flight.slot,
                    f"its rollout ran for more than {timeout:g}s (daskcollect.timeouts.rollout); "
                    "an env may be stuck in step()",
                    hung=True,
                )
        if now < self._next_liveness:
            return
        self._next_liveness = now + config.seconds("liveness-interval")
        alive = live_workers(self.client)
        self.retiring &= alive  # a retired worker that left may come back under its address
        busy = {f.slot.address: f.slot for f in running}
        for address, slot in busy.items():
            if address not in alive:
                raise CollectorLost(slot, f"its worker {address} left the cluster")

    def next_rollout(self, timeout: float) -> Rollout:
        """Waits for the next finished rollout, in completion order.

        Args:
            timeout: The bound on each rollout call, from its start.

        Raises:
            RolloutError: If the rollout raised on its worker.
            CollectorLost: If a collector's worker is gone or its rollout is stuck.
        """
        while True:
            self._check_liveness(timeout)  # cheap; asks the scheduler once per liveness-interval
            try:
                call = self._completed.get(timeout=0.25)
            except queue.Empty:
                continue
            flight = self._inflight.pop(call, None)
            if flight is None:
                continue  # the call of an abandoned collector
            try:
                out: Rollout = call.result(timeout=config.timeout("call"))
            except RolloutError:
                raise
            except Exception as exc:
                cause = f"its call failed ({type(exc).__name__}: {exc})"
                raise CollectorLost(flight.slot, cause, calls=1) from exc
            slot = flight.slot
            if flight.weights is not None and slot.pending is flight.weights:
                slot.pending = None  # the actor has these weights now
            slot.batches_since_update += 1
            slot.frames += out.frames
            slot.seconds += out.seconds
            slot.rollouts += 1
            slot.policy_version = out.policy_version
            return out

    def drain(self, timeout: float) -> None:
        """Waits (bounded) for calls in flight and discards their results."""
        deadline = time.monotonic() + timeout
        while self._inflight and time.monotonic() < deadline:
            try:
                self.next_rollout(max(deadline - time.monotonic(), 0.01))
            except CollectorLost as lost:
                self.abandon(lost.slot)
            except Exception:  # a failed rollout: nothing to keep
                pass

    # --- other calls -------------------------------------------------------
    def call_all(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Calls ``method`` on every actor concurrently; results in slot order."""
        timeout = config.timeout("call") if timeout is None else timeout
        calls = [getattr(s.actor, method)(*args) for s in self.slots]
        return [c.result(timeout=timeout) for c in calls]

    def call(self, slot: Slot, method: str, *args: Any, timeout: float | None = None) -> Any:
        timeout = config.timeout("call") if timeout is None else timeout
        return getattr(slot.actor, method)(*args).result(timeout=timeout)

    # --- close -------------------------------------------------------------
    def close(self, timeout: float) -> None:
        """Closes every actor's collector, then deletes the actors (bounded)."""
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(TOPIC)
        self.drain(timeout / 2)
        deadline = time.monotonic() + timeout / 2
        calls = []
        for slot in self.slots:
            with contextlib.suppress(Exception):
                calls.append(slot.actor.close())
        for call in calls:
            with contextlib.suppress(Exception):
                call.result(timeout=max(deadline - time.monotonic(), 0.01))
        futures = [s.future for s in self.slots]
        with contextlib.suppress(Exception):
            self.client.cancel(futures)
        for slot in self.slots:
            slot.pending = None
        self.slots = []
        self._inflight.clear()
        self._latest.clear()
        self._newest = None
        if self._shm is not None:
            self._shm.close()
