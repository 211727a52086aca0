"""The Dask transport: one scatter per version, then copied host to host along a tree.

Workers on other hosts than the driver's get each weights version this way:

- the driver scatters it once, to one worker (the first host's leader);
- it is copied to one leader worker on each other host along a binomial tree
  (:mod:`daskcollect.weights.tree`), so an update costs about
  ``1 + log2(hosts)`` transfers of one link;
- the other workers of a host fetch it from their leader when they load it,
  over the host's loopback.

A worker that joined later, or whose leader left, fetches it from another
holder, then from any worker the scheduler lists.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from distributed import Client
from distributed.comm import get_address_host
from tensordict import TensorDictBase

from daskcollect import _internals
from daskcollect.weights import tree
from daskcollect.weights.payload import Sent, WeightsPayload

ROUTE = "dask"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScatterRef:
    """A weights version scattered under the Dask key ``key``, held by the host leaders ``holders``."""

    version: int
    key: str
    holders: tuple[str, ...] = ()

    def read(self, worker: Any, timeout: float) -> TensorDictBase:
        """The weights from this worker's memory, or from a worker that holds them."""
        payload = tree.held(worker, self.key)
        if payload is None:
            # A Future made in an actor thread never resolves: ask the holders directly.
            payload = _internals.sync(
                worker.loop, tree.fetch, worker, self.key, self.holders, callback_timeout=timeout
            )
        return payload.weights


def host_leaders(addresses: list[str]) -> list[str]:
    """One worker per host among ``addresses`` (the first of each host's, sorted)."""
    leaders: dict[str, str] = {}
    for address in sorted(set(addresses)):
        leaders.setdefault(get_address_host(address), address)
    return list(leaders.values())


class ScatterTransport:
    """Scatters each version once to the workers that need it.

    Args:
        client: Our ``Client``.
        timeout: The bound on one version's whole fan-out (the scatter and every round of
            copies), in seconds.
    """

    route = ROUTE

    def __init__(self, client: Client, timeout: float):
        self.client = client
        self.timeout = timeout
        self._keys: list[str] = []  # every version sent: the workers' copies of them go at close
        self._workers: set[str] = set()  # every worker sent to (holders, and those that fetch)

    def send(self, weights: TensorDictBase, version: int, addresses: list[str]) -> Sent:
        """Scatters ``weights`` to one host leader, then copies it to the others, within one
        deadline.

        Raises:
            TimeoutError: If the scatter does not finish within the timeout.
        """
        deadline = time.monotonic() + self.timeout
        payload = WeightsPayload.pack(weights, version)
        heads = host_leaders(addresses)
        future = self.client.scatter(
            payload, workers=heads[:1], hash=False, direct=True, timeout=self.timeout
        )
        self._keys.append(future.key)
        self._workers.update(addresses)
        left_out: list[str] = []
        if len(heads) > 1:
            copy, left = tree.copy_along_tree, max(deadline - time.monotonic(), 0.0)
            left_out = _internals.sync(self.client.loop, copy, self.client, future.key, heads, deadline,
                            callback_timeout=left + 1)  # fmt: skip
            if left_out:  # gone or going: their streams and the worker events deal with their collectors
                logger.info("weights version %d did not reach %s", version, left_out)
        holders = tuple(a for a in heads if a not in left_out)
        return Sent(ScatterRef(version, future.key, holders), payload, future, ROUTE)

    def close(self, timeout: float = 5.0) -> None:
        """Has every worker sent to forget its copies of this collection's versions (bounded,
        idempotent); Dask's own copies go with the futures."""
        keys, self._keys = self._keys, []
        if not keys or not self._workers:
            return
        deadline = time.monotonic() + timeout
        with contextlib.suppress(Exception):  # a client that lost its scheduler: the workers go too
            _internals.sync(self.client.loop, tree.drop, self.client, keys, sorted(self._workers), deadline,
                 callback_timeout=timeout + 1)  # fmt: skip
