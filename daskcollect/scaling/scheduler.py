"""The scheduler's side of scaling to demand: :class:`DemandScaling` (runs on the scheduler).

It imports nothing heavy: the scheduler unpickles it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from daskcollect import _internals
from daskcollect.leases.scheduler import HandlerPlugin
from daskcollect.monitoring.scheduler import STATS_TOPIC
from daskcollect.retirement import ACTOR_KEY_PREFIX
from daskcollect.scaling import SCALING_PLUGIN

logger = logging.getLogger(__name__)

#: Seconds after which a collection's demand, not renewed by its stats (sent every second), is dropped.
STALE_AFTER = 30.0

#: Every daskcollect actor's key starts so; collectors' with :data:`ACTOR_KEY_PREFIX`.
DASKCOLLECT_PREFIX = "daskcollect-"


class DemandScaling(HandlerPlugin):
    """Feeds the collections' wanted collectors into ``adaptive_target``; see :mod:`daskcollect.scaling`."""

    name = SCALING_PLUGIN

    handler = "adaptive_target"

    def __init__(self) -> None:
        super().__init__()
        #: collection id -> the collectors it wants (from its latest stats), and when that came.
        self.wanted: dict[str, tuple[int, float]] = {}

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != STATS_TOPIC or not isinstance(msg, dict) or "id" not in msg:
            return
        wanted = msg.get("wanted_collectors")
        if msg.get("state") == "closed" or wanted is None:
            self.wanted.pop(msg["id"], None)
        else:
            self.wanted[msg["id"]] = (int(wanted), time.monotonic())

    async def handle(self, kwargs: dict[str, Any]) -> int:
        """The larger of Dask's target and the workers the collections want."""
        kwargs.pop("comm", None)
        dask_target = self.original(**kwargs)
        if hasattr(dask_target, "__await__"):
            dask_target = await dask_target
        # A driver that died without closing stops reporting: its demand goes stale, then is forgotten.
        now = time.monotonic()
        for key in [k for k, (_, at) in self.wanted.items() if now - at > STALE_AFTER]:
            del self.wanted[key]
        wanted = sum(n for n, _ in self.wanted.values())
        if wanted:
            # Workers that host other actors (inference servers, replay buffers) stay on top.
            others = sum(
                1 for a in _internals.worker_addresses_by_name(self.scheduler) if self._hosts_other(a)
            )
            return max(int(dask_target), wanted + others)
        return int(dask_target)

    def _hosts_other(self, address: str) -> bool:
        keys = _internals.actor_keys(self.scheduler, address)
        return any(k.startswith(DASKCOLLECT_PREFIX) and not k.startswith(ACTOR_KEY_PREFIX) for k in keys)

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        """Leaves out the workers that host a daskcollect actor other than a collector."""
        return [ws for ws in workers if not self._hosts_other(_internals.worker_state_address(ws))]
