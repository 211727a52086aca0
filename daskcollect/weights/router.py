"""The weight router: versions, what each collector has still to load, and the route to it.

The router is the single owner of weights versions. Each update is written
once per route (shared memory for collectors on the driver's host, one Dask
scatter for the others) and recorded as *pending* for its collectors; the next
rollout call of a collector carries the pending reference, and a rollout that
reports having loaded that version clears it. The latest weights of each
collector are kept, so that a replacement starts from them.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from tensordict import TensorDictBase

from daskcollect.errors import ConfigurationError
from daskcollect.weights.payload import Sent
from daskcollect.weights.scatter import ScatterTransport
from daskcollect.weights.shm import Probe, SharedMemoryTransport


class Target(Protocol):
    """A collector as the router sees it."""

    index: int
    address: str
    on_driver_host: bool


def _schema(weights: TensorDictBase) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each weight's dotted key, shape and dtype."""
    flat = weights.flatten_keys(".")
    return {
        str(k): (tuple(t.shape), str(t.dtype).replace("torch.", ""))
        for k, t in flat.items(leaves_only=True)
        if hasattr(t, "shape")
    }


class WeightRouter:
    """Sends weights through the right transport and tracks what each collector has.

    Args:
        scatter: The Dask transport (always available).
        shm: The shared-memory transport, or ``None`` where it is off.
        reference: Weights of the driver's policy: every update must have
            their keys, shapes and dtypes. Without it, the first update sets them.
    """

    def __init__(
        self,
        scatter: ScatterTransport,
        shm: SharedMemoryTransport | None,
        reference: TensorDictBase | None = None,
    ):
        self._scatter = scatter
        self._shm = shm
        self._schema = _schema(reference) if reference is not None else None
        # The last versions stay alive a little longer than the collectors' own: an actor
        # told of a version may read it just as the next one is published.
        self._recent: deque[Sent] = deque(maxlen=2)
        self.version = 0
        self._pending: dict[int, Sent] = {}
        self._latest: dict[int, Sent] = {}
        self._newest: Sent | None = None
        self._since_update: dict[int, int] = {}

    @property
    def probe(self) -> Probe | None:
        """What actors read to find out whether they share the driver's shared memory."""
        return self._shm.probe if self._shm is not None else None

    def publish(self, weights: TensorDictBase, targets: list[Target]) -> int:
        """Sends ``weights`` as a new version to ``targets``; returns that version.

        Raises:
            ConfigurationError: Before anything is sent, if the keys, shapes or
                dtypes differ from the policy's, naming the first that differ.
        """
        self._check(weights)
        version = self.version + 1
        self._send(weights, version, targets)  # raises before the version moves
        self.version = version
        return version

    def adopt(self, target: Target) -> None:
        """Gives a new collector the latest weights sent to its index, or to anyone."""
        sent = self._latest.get(target.index) or self._newest
        if sent is not None:
            # Sent again: the old replicas may have died with the old worker.
            self._send(sent.payload.weights, sent.version, [target])

    def _send(self, weights: TensorDictBase, version: int, targets: list[Target]) -> None:
        if not targets:
            return
        local = [t for t in targets if t.on_driver_host] if self._shm is not None else []
        routes: list[tuple[Sent, list[Target]]] = []
        sent = self._shm.send(weights, version, [t.address for t in local]) if local else None
        if sent is not None:
            routes.append((sent, local))
        remote = [t for t in targets if sent is None or not t.on_driver_host]
        if remote:
            routes.append((self._scatter.send(weights, version, [t.address for t in remote]), remote))
        for sent, group in routes:
            self._recent.append(sent)
            if self._newest is None or version >= self._newest.version:
                self._newest = sent
            for target in group:
                self._pending[target.index] = self._latest[target.index] = sent
                self._since_update[target.index] = 0

    def carry(self, index: int, sent: Sent) -> None:
        """Makes collector ``index``'s next rollout call carry ``sent``.

        For tools and tests that route weights themselves (e.g. to a worker
        that does not host the collector).
        """
        self._pending[index] = self._latest[index] = sent

    def _check(self, weights: TensorDictBase) -> None:
        schema = _schema(weights)
        if self._schema is None:
            self._schema = schema
            return
        if schema == self._schema:
            return
        missing = [k for k in self._schema if k not in schema]
        extra = [k for k in schema if k not in self._schema]
        changed = [
            f"{k}: {schema[k][0]} {schema[k][1]} instead of {self._schema[k][0]} {self._schema[k][1]}"
            for k in schema
            if k in self._schema and schema[k] != self._schema[k]
        ]
        parts = [
            f"{what} {items[:3]}" for what, items in (("missing", missing), ("unexpected", extra)) if items
        ]
        parts += changed[:3]
        raise ConfigurationError(
            f"These weights do not fit the policy: {'; '.join(parts)}. Nothing was sent. Pass the "
            "weights of the same policy architecture, e.g. TensorDict.from_module(policy).",
            missing=missing,
            unexpected=extra,
        )

    def sent_version(self, index: int) -> int:
        """The newest version sent to collector ``index`` (0: the weights it was built with)."""
        sent = self._latest.get(index)
        return sent.version if sent is not None else 0

    def pending(self, index: int) -> Sent | None:
        """The weights collector ``index`` has not loaded yet (its next call carries them)."""
        return self._pending.get(index)

    def loaded(self, index: int, version: int) -> None:
        """Records a batch of collector ``index`` collected with weights ``version``."""
        self._since_update[index] = self._since_update.get(index, 0) + 1
        sent = self._pending.get(index)
        if sent is not None and sent.version <= version:
            del self._pending[index]

    def stale(self, indices: list[int], interval: int) -> list[int]:
        """The collectors that produced more than ``interval`` batches since their last update."""
        return [i for i in indices if self._since_update.get(i, 0) > interval]

    def route(self, index: int) -> str | None:
        """How collector ``index`` got its latest weights (``None``: only those it was built with)."""
        sent = self._latest.get(index)
        return sent.route if sent is not None else None

    def forget(self, index: int) -> None:
        """Drops what is kept for collector ``index``, which left for good."""
        self._pending.pop(index, None)
        self._latest.pop(index, None)
        self._since_update.pop(index, None)

    def indices(self) -> set[int]:
        """The collectors something is kept for."""
        return set(self._pending) | set(self._latest) | set(self._since_update)

    def sizes(self) -> dict[str, int]:
        """How many collectors each per-collector table holds (a bound check)."""
        return {
            "pending": len(self._pending),
            "latest": len(self._latest),
            "since update": len(self._since_update),
        }

    def close(self, timeout: float = 5.0) -> None:
        """Drops every reference (their files and futures go), the workers' copies (bounded by
        ``timeout``) and the shared-memory folder."""
        self._pending.clear()
        self._latest.clear()
        self._newest = None
        self._recent.clear()
        self._scatter.close(timeout)
        if self._shm is not None:
            self._shm.close()
