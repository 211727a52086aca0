"""What a collection costs in allocated worker time: worker-seconds per 1,000 frames, by resource class.

Runs on the driver. On HPC the allocation is what users pay for: a worker
that hosts a collector is held for the collector's whole life, whether it
collects, waits for weights or waits for the learner. :class:`WorkerTime`
adds up each collector's life from the stats snapshots (taken about once a
second, so a collector's life is known to within a snapshot), and divides by
the frames the collection yielded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping


def resource_class(resources: Mapping[str, float] | None) -> str:
    """The name of the workers a collection runs on: its ``worker_resources``, or ``"any"``."""
    if not resources:
        return "any"
    return ",".join(f"{k}={v:g}" for k, v in sorted(resources.items()))


class WorkerTime:
    """Worker-seconds held by one collection's collectors.

    Args:
        resources: The collection's ``worker_resources`` (its class of worker).
    """

    def __init__(self, resources: Mapping[str, float] | None) -> None:
        self.resource_class = resource_class(resources)
        self._ended = 0.0
        self._since: dict[int, float] = {}

    def seen(self, collectors: Iterable[int]) -> None:
        """Records which collectors (by actor incarnation) are live now."""
        now = time.monotonic()
        live = set(collectors)
        for uid in live - self._since.keys():
            self._since[uid] = now
        for uid in set(self._since) - live:
            self._ended += now - self._since.pop(uid)

    def seconds(self) -> float:
        """Worker-seconds held so far."""
        now = time.monotonic()
        return self._ended + sum(now - t for t in self._since.values())

    def as_dict(self, frames: int) -> dict[str, dict[str, float | None]]:
        """``worker_seconds`` and ``worker_seconds_per_kframe``, each by resource class."""
        seconds = self.seconds()
        per = 1000.0 * seconds / frames if frames else None
        return {
            "worker_seconds": {self.resource_class: round(seconds, 3)},
            "worker_seconds_per_kframe": {self.resource_class: None if per is None else round(per, 3)},
        }
