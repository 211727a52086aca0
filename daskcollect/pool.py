"""The live set of collector actors: placement, start, calls in flight, close.

Failure handling lives here, not in the iteration code: every wait is bounded
by a timeout from :mod:`daskcollect.config`, and a failed start releases what
it created before raising.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from distributed import Client, Future, as_completed, wait
from distributed.actor import Actor, BaseActorFuture

from daskcollect import config
from daskcollect.actor import ActorSpec, CollectorActor, Rollout
from daskcollect.errors import CollectorBuildError, CollectorTimeoutError, DaskCollectError, RolloutError
from daskcollect.weights import WeightsPayload, WeightsRef


@dataclass
class Slot:
    """One collector: its actor and what the driver knows about it.

    Attributes:
        index: The collector's position (0..num_collectors-1).
        uid: The actor incarnation (namespaces trajectory ids).
        address: The worker hosting the actor.
        future: The actor's task future; releasing it deletes the actor.
        actor: The actor proxy.
        pending: Newer weights to send with the next rollout call, kept alive
            with their future until a call carrying them completes.
        batches_since_update: Batches produced since the last weights update.
    """

    index: int
    uid: int
    address: str
    future: Future
    actor: Actor
    pending: tuple[WeightsRef, Future] | None = None
    batches_since_update: int = 0


@dataclass
class InFlight:
    """A rollout call that has not been consumed yet."""

    slot: Slot
    call: BaseActorFuture
    weights: tuple[WeightsRef, Future] | None
    started: float = field(default_factory=time.monotonic)


class ActorPool:
    """Starts, drives and closes one actor per worker.

    Args:
        client: Our ``Client(direct_to_workers=True)``.
        track_policy_version: Passed to every actor.
        memmap_root: Where actors write their rollouts (``output="memmap"``).
    """

    def __init__(self, client: Client, track_policy_version: bool = False, memmap_root: str | None = None):
        self.client = client
        self.track_policy_version = track_policy_version
        self.memmap_root = memmap_root
        self.slots: list[Slot] = []
        self._uids = itertools.count()
        self._token = uuid.uuid4().hex[:8]
        self._inflight: dict[BaseActorFuture, InFlight] = {}
        self._completed = as_completed(loop=client.loop)

    # --- start -------------------------------------------------------------
    def start(self, recipes: list[bytes], addresses: list[str]) -> None:
        """Starts one actor per recipe, the i-th on ``addresses[i]``.

        Raises:
            CollectorBuildError: (or a subclass) if a collector fails to build.
            CollectorTimeoutError: If a collector is not built within
                ``daskcollect.timeouts.actor-start``.
        """
        # Each distinct recipe is sent once; Dask resolves the futures on the workers.
        blobs: dict[bytes, Future] = {}
        for recipe in recipes:
            if recipe not in blobs:
                blobs[recipe] = self.client.scatter(
                    recipe, hash=False, direct=True, timeout=config.timeout("weights")
                )
        futures = []
        for index, (recipe, address) in enumerate(zip(recipes, addresses)):
            uid = next(self._uids)
            spec = ActorSpec(index, uid, self.track_policy_version, self.memmap_root)
            futures.append(
                self.client.submit(
                    CollectorActor,
                    spec,
                    blobs[recipe],
                    actor=True,
                    workers=[address],
                    allow_other_workers=False,
                    pure=False,
                    key=f"daskcollect-actor-{self._token}-{uid}",
                )
            )
        timeout = config.timeout("actor-start")
        try:
            with self.client.as_current():
                done, not_done = wait(futures, timeout=timeout, return_when="ALL_COMPLETED")
        except TimeoutError:
            not_done = [f for f in futures if not f.done()]
        try:
            if not_done:
                late = [i for i, f in enumerate(futures) if f in set(not_done)]
                raise CollectorTimeoutError(
                    f"Collectors {late} were not built within {timeout:g}s. Building envs "
                    "and policy on the workers is too slow or stuck: check the env "
                    "constructor, or raise daskcollect.timeouts.actor-start.",
                    indices=late,
                )
            for future in futures:
                if future.status == "error":
                    exc = future.exception()
                    if isinstance(exc, DaskCollectError):
                        raise exc  # ours, raised on the worker: it names the cause already
                    raise CollectorBuildError(
                        f"A collector could not be started on {addresses[futures.index(future)]}: "
                        f"{type(exc).__name__}: {exc}. Check that daskcollect, torch and torchrl "
                        "are installed on the workers in the same versions as here."
                    ) from exc
            with self.client.as_current():
                for index, (future, address) in enumerate(zip(futures, addresses)):
                    actor = future.result(timeout=timeout)
                    uid = int(future.key.rsplit("-", 1)[1])
                    self.slots.append(Slot(index, uid, address, future, actor))
        except BaseException:
            self.client.cancel(futures)
            self.slots = []
            raise

    # --- weights -----------------------------------------------------------
    def scatter_weights(self, payload: WeightsPayload, slots: list[Slot]) -> None:
        """Scatters ``payload`` once, replicated to ``slots``' workers by Dask.

        Each slot sends the reference with its next rollout call.
        """
        if not slots:
            return
        addresses = sorted({s.address for s in slots})
        future = self.client.scatter(
            payload,
            workers=addresses,
            broadcast=len(addresses) > 1,
            hash=False,
            direct=True,
            timeout=config.timeout("weights"),
        )
        ref = WeightsRef(future.key, payload.version)
        for slot in slots:
            slot.pending = (ref, future)
            slot.batches_since_update = 0

    # --- rollouts ----------------------------------------------------------
    def submit_rollout(self, slot: Slot) -> None:
        """Starts a rollout on ``slot`` (weights included when newer ones are pending)."""
        pending = slot.pending
        call = slot.actor.rollout(pending[0] if pending else None)
        self._inflight[call] = InFlight(slot, call, pending)
        self._completed.add(call)

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def inflight_count(self, slot: Slot) -> int:
        """Rollout calls in flight on ``slot``."""
        return sum(f.slot is slot for f in self._inflight.values())

    def next_rollout(self, timeout: float) -> Rollout:
        """Waits for the next finished rollout, in completion order.

        Raises:
            RolloutError: If the rollout raised on its worker, or the worker was lost.
            CollectorTimeoutError: If none finishes within ``timeout`` seconds.
        """
        ac = self._completed
        deadline = time.monotonic() + timeout
        with ac.thread_condition:
            while not ac.has_ready():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    slow = sorted(f.slot.index for f in self._inflight.values())
                    raise CollectorTimeoutError(
                        f"No rollout finished within {timeout:g}s (collectors {slow} are "
                        "still running). An env may be stuck in step(); raise "
                        "daskcollect.timeouts.rollout if rollouts are legitimately this slow.",
                        indices=slow,
                    )
                ac.thread_condition.wait(min(remaining, 1.0))
        call = next(ac)
        flight = self._inflight.pop(call)
        try:
            out: Rollout = call.result(timeout=timeout)
        except RolloutError:
            raise
        except OSError as exc:
            raise RolloutError(
                f"collector {flight.slot.index}: its worker {flight.slot.address} was lost "
                f"({exc}). Check the worker's logs (memory limit, killed process).",
                worker=flight.slot.address,
                index=flight.slot.index,
            ) from exc
        slot = flight.slot
        if flight.weights is not None and slot.pending is flight.weights:
            slot.pending = None  # the actor has these weights now
        slot.batches_since_update += 1
        return out

    def drain(self, timeout: float) -> None:
        """Waits (bounded) for calls in flight and discards their results."""
        deadline = time.monotonic() + timeout
        while self._inflight and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                self.next_rollout(max(deadline - time.monotonic(), 0.01))

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
        self.drain(min(timeout / 2, timeout))
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
