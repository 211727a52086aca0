"""Weights copied host to host along a binomial tree, held outside Dask's data.

The driver scatters a weights version to one worker; :func:`copy_along_tree`
then has one worker per other host pull it, in rounds where every holder serves
one new worker, so ``n`` hosts take ``ceil(log2(n))`` rounds of one transfer per
holder's link. Dask's own ``scatter(..., broadcast=True)`` lets one holder serve
several workers in a round while others wait, and copies to every worker
whatever its host: it grew faster than linearly in the hosts when measured
(``benchmarks/cross_host.py``).

The copies are held by daskcollect on each worker (the newest :data:`KEEP`
versions), not in the worker's Dask data: the scheduler's Active Memory
Manager, which runs by default on clusters that are not daskcollect's own,
drops "superfluous" replicas of Dask data every two seconds, and the collectors
would then fetch every version from the one worker left holding it. Each worker
hosting a collector answers three requests, installed by :func:`install`:
``daskcollect_weights_get`` (a version it holds), ``daskcollect_weights_pull``
(fetch one from a given worker and hold it) and ``daskcollect_weights_drop``
(forget versions: the driver's transport sends it when it closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from functools import partial
from typing import Any

from distributed.comm import get_address_host
from distributed.protocol import to_serialize

from daskcollect import _internals

#: Versions each worker holds (a collector told of a version may read it as the next one arrives).
KEEP = 3

_held: OrderedDict[str, Any] = OrderedDict()


def hold(key: str, payload: Any) -> None:
    """Keeps ``payload`` under ``key`` on this worker, dropping the oldest beyond :data:`KEEP`."""
    _held[key] = payload
    _held.move_to_end(key)
    while len(_held) > KEEP:
        _held.popitem(last=False)


def forget_all() -> None:
    """Drops every copy this worker holds (its last collection closed)."""
    _held.clear()


def held_keys() -> list[str]:
    """The versions this worker holds for daskcollect now, oldest first."""
    return list(_held)


def held(worker: Any, key: str) -> Any | None:
    """The payload of ``key`` if this worker holds it (daskcollect's copy, or Dask's data)."""
    payload = _held.get(key)
    if payload is None:
        payload = _internals.local_data(worker, key)
    return payload


def install(worker: Any) -> None:
    """Makes ``worker`` answer the tree's two requests (idempotent).

    The handlers are closures over ``worker``: Dask's server wants named
    functions (no ``functools.partial``).
    """

    async def daskcollect_weights_get(key: str) -> dict:
        payload = held(worker, key)
        return (
            {"status": "missing"} if payload is None else {"status": "OK", "payload": to_serialize(payload)}
        )

    async def daskcollect_weights_pull(key: str, source: str) -> dict:
        if held(worker, key) is None:
            answer = await _internals.rpc(worker, source).daskcollect_weights_get(key=key)
            if answer.get("status") != "OK":
                return {"status": "missing"}
            hold(key, answer["payload"])
        return {"status": "OK"}

    def daskcollect_weights_drop(keys: list[str]) -> int:
        dropped = [_held.pop(k) for k in keys if k in _held]
        return len(dropped)

    handlers = (daskcollect_weights_get, daskcollect_weights_pull, daskcollect_weights_drop)
    _internals.add_handlers(worker, {f.__name__: f for f in handlers})


async def drop(client: Any, keys: list[str], addresses: list[str], deadline: float) -> None:
    """Has ``addresses`` forget their copies of ``keys`` (bounded by ``deadline``; a worker that
    left or does not answer in time is skipped: its copies went, or go, with it)."""
    left = max(deadline - time.monotonic(), 0.01)
    await asyncio.gather(
        *(
            asyncio.wait_for(_internals.rpc(client, a).daskcollect_weights_drop(keys=keys), left)
            for a in addresses
        ),
        return_exceptions=True,
    )


async def copy_along_tree(client: Any, key: str, addresses: list[str], deadline: float) -> list[str]:
    """Copies ``key``, held by ``addresses[0]``, to the other workers along a binomial tree.

    Args:
        client: The driver's client.
        key: The weights version's key.
        addresses: The workers, the holder first.
        deadline: When the whole fan-out must be over (``time.monotonic()``); every round gets
            what is left of it, not a timeout of its own.

    Returns:
        The workers left out: unreachable, or not reached by ``deadline``.
    """

    async def copy(source: str, target: str) -> None:
        answer = await _internals.rpc(client, target).daskcollect_weights_pull(key=key, source=source)
        if answer.get("status") != "OK":
            raise OSError(f"{target} could not fetch {key} from {source}")

    holders, todo, left_out = addresses[:1], list(addresses[1:]), []
    while todo:
        pairs = list(zip(holders, todo))
        todo = todo[len(pairs) :]
        left = max(deadline - time.monotonic(), 0.0)
        answers = await asyncio.gather(
            *(asyncio.wait_for(copy(source, target), left) for source, target in pairs),
            return_exceptions=True,
        )
        for (_, target), answer in zip(pairs, answers):
            (left_out if isinstance(answer, BaseException) else holders).append(target)
    return left_out


def nearest_first(worker: Any, addresses: list[str] | tuple[str, ...]) -> list[str]:
    """``addresses`` but ``worker``'s own, those on its host first: a copy over the loopback, not
    over the host's link."""
    here = get_address_host(worker.address)
    return sorted((a for a in addresses if a != worker.address), key=lambda a: get_address_host(a) != here)


async def fetch(worker: Any, key: str, holders: tuple[str, ...]) -> Any:
    """The payload of ``key`` from a worker that holds it: ``holders`` on this host first, then the
    others, then any worker the scheduler lists (this host's first); held here afterwards.

    Raises:
        KeyError: If no live worker holds it.
    """
    for address in nearest_first(worker, holders):
        with contextlib.suppress(Exception):  # a holder that left, or runs no collector any more: the next
            answer = await _internals.rpc(worker, address).daskcollect_weights_get(key=key)
            if answer.get("status") == "OK":
                hold(key, answer["payload"])
                return answer["payload"]
    payload = await _internals.fetch_from_peers(worker, key, partial(nearest_first, worker))
    hold(key, payload)
    return payload
