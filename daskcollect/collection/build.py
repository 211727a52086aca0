"""Building collector actors on chosen workers: a recipe sent once, one actor task per worker, and a
bounded wait that sorts the actors built from those whose worker left and those too slow to build.

The pool (:mod:`daskcollect.collection.pool`) decides the uids and keeps the
table; this module turns ``(index, recipe, address)`` targets into
:class:`Slot` records and says which targets were lost.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass, replace

from distributed import Actor, Client, Future, wait

from daskcollect.deploy.py_modules import missing_module_hint
from daskcollect.errors import CollectorBuildError, CollectorTimeoutError, DaskCollectError
from daskcollect.retirement import ACTOR_KEY_PREFIX
from daskcollect.worker.launch import start_collector
from daskcollect.worker.rollout import ActorSpec

logger = logging.getLogger(__name__)

#: What to build: the collector's index, its cloudpickled recipe, and the worker to build it on.
Target = tuple[int, bytes, str]


@dataclass(eq=False)
class Slot:
    """One collector: its actor and what the driver knows about it.

    Attributes:
        index: The collector's index (0..num_collectors-1).
        uid: The actor incarnation (namespaces trajectory ids).
        address: The worker hosting the actor.
        future: The actor's task future; releasing it deletes the actor.
        actor: The actor proxy.
        recipe: The cloudpickled recipe, kept to start a replacement.
        on_driver_host: Its worker reads the driver's shared memory, so it gets
            weights through the shared-memory transport.
        rollouts: Rollouts it delivered; ``frames`` their frames, ``seconds``
            their wall time on the worker.
        policy_version: The weights version of its last rollout.
        retiring: Its worker is retiring gracefully: no new calls.
        retired: Its actor has been closed and released.
    """

    index: int
    uid: int
    address: str
    future: Future
    actor: Actor
    recipe: bytes
    on_driver_host: bool = False
    rollouts: int = 0
    frames: int = 0
    seconds: float = 0.0
    policy_version: int = 0
    retiring: bool = False
    retired: bool = False
    inflight: int = 0


def submit_actors(
    client: Client,
    targets: list[Target],
    uids: list[int],
    template: ActorSpec,
    token: str,
    seed: int | None,
    timeout: float,
) -> list[Future]:
    """Sends each distinct recipe once, then submits one actor task per target, pinned to its worker.

    Raises:
        OSError, TimeoutError, KeyError: If a target left (the scheduler no longer knows it).
    """
    where: dict[bytes, set[str]] = {}
    for _, recipe, address in targets:
        where.setdefault(recipe, set()).add(address)
    # The other targets fetch a recipe from where it was scattered when they build.
    blobs = {
        recipe: client.scatter(recipe, workers=sorted(addresses), hash=False, direct=True, timeout=timeout)
        for recipe, addresses in where.items()
    }
    return [
        client.submit(
            start_collector,
            pickle.dumps(replace(template, index=index, uid=uid, seed=seed)),
            blobs[recipe],
            actor=True,
            workers=[address],
            allow_other_workers=False,
            pure=False,
            key=f"{ACTOR_KEY_PREFIX}{token}-{uid}",
        )
        for (index, recipe, address), uid in zip(targets, uids)
    ]


def collect_built(
    client: Client,
    targets: list[Target],
    uids: list[int],
    futures: list[Future],
    timeout: float,
    usable: Callable[[], set[str]],
) -> tuple[list[Slot], list[int]]:
    """Waits (bounded) for the actors: the slots built, and the indices whose worker left.

    Args:
        usable: Called once the wait ends: the workers still there and not retiring.

    Raises:
        CollectorBuildError: (or the worker's own :class:`DaskCollectError`) if a build failed.
        CollectorTimeoutError: For actors neither built nor lost in time.
    """
    try:
        with client.as_current():
            wait(futures, timeout=timeout, return_when="ALL_COMPLETED")
    except (TimeoutError, CancelledError):
        pass  # sorted out below, future by future
    still = usable()
    slots, lost, late = [], [], []
    for (index, recipe, address), uid, future in zip(targets, uids, futures):
        if future.status == "error":
            raise build_error(address, future.exception())
        if future.status == "finished":
            with client.as_current():
                actor = future.result(timeout=timeout)
            slots.append(Slot(index, uid, address, future, actor, recipe))
        elif address not in still or future.status != "pending":
            lost.append(index)  # its worker left (or is leaving) during the start
            client.cancel([future])
        else:
            late.append(index)
    if late:
        raise CollectorTimeoutError(
            f"Collectors {late} were not built within {timeout:g}s. Building envs "
            "and policy on the workers is too slow or stuck: check the env "
            "constructor, or raise daskcollect.timeouts.actor-start.",
            indices=late,
        )
    return slots, lost


def build_error(address: str, exc: BaseException) -> BaseException:
    """The error to raise for a collector whose build raised ``exc`` on worker ``address``."""
    if isinstance(exc, DaskCollectError):
        return exc  # ours, raised on the worker: it names the cause already
    hint = missing_module_hint(exc)
    if hint:
        error = CollectorBuildError(f"A collector could not be started on {address}. {hint}")
    else:
        error = CollectorBuildError(
            f"A collector could not be started on {address}: {type(exc).__name__}: "
            f"{exc}. Check that daskcollect, torch and torchrl are installed on the "
            "workers in the same versions as here.",
        )
    error.__cause__ = exc
    return error


def find_driver_host(slots: list[Slot], timeout: float) -> None:
    """Marks the slots whose worker reads the driver's shared memory (asked once, bounded)."""
    calls = [(slot, slot.actor.shares_driver_memory()) for slot in slots]
    for slot, call in calls:
        try:
            slot.on_driver_host = bool(call.result(timeout=timeout))
        except Exception as exc:  # its worker is leaving: the rollout path will tell
            logger.debug("collector %d: no answer on shared memory (%s)", slot.index, exc)
