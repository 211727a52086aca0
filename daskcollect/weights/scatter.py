"""The Dask transport: one scatter per version, replicated between the workers that need it.

Workers on other hosts than the driver's get each weights version through one
``Client.scatter(..., broadcast=True, hash=False, direct=True)``: the driver
sends it once and Dask copies it between those workers. A worker whose replica
was dropped (the Active Memory Manager's ``ReduceReplicas``, a worker that
joined later) fetches it from a worker that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distributed import Client
from distributed.utils import sync
from tensordict import TensorDictBase

from daskcollect import _dask
from daskcollect.weights.payload import Sent, WeightsPayload

ROUTE = "dask"


@dataclass(frozen=True)
class ScatterRef:
    """A weights version scattered under the Dask key ``key``."""

    version: int
    key: str

    def read(self, worker: Any, timeout: float) -> TensorDictBase:
        """The weights from this worker's memory, or from a worker that holds them."""
        try:
            payload = worker.data[self.key]
        except KeyError:
            # A Future made in an actor thread never resolves: ask the holders directly.
            payload = sync(worker.loop, _dask.fetch_from_peers, worker, self.key, callback_timeout=timeout)
        return payload.weights


class ScatterTransport:
    """Scatters each version once to the workers that need it.

    Args:
        client: Our ``Client``.
        timeout: The bound on one scatter, in seconds.
    """

    route = ROUTE

    def __init__(self, client: Client, timeout: float):
        self.client = client
        self.timeout = timeout

    def send(self, weights: TensorDictBase, version: int, addresses: list[str]) -> Sent:
        payload = WeightsPayload.pack(weights, version)
        targets = sorted(set(addresses))
        future = self.client.scatter(
            payload,
            workers=targets,
            broadcast=len(targets) > 1,
            hash=False,
            direct=True,
            timeout=self.timeout,
        )
        return Sent(ScatterRef(version, future.key), payload, future, ROUTE)

    def close(self) -> None:
        """Nothing to release: the futures go with the references to them."""
