"""The scheduler's side of graceful retirement: :class:`GracefulRetirement` (runs on the scheduler).

It imports nothing heavy: the scheduler unpickles it.
"""

from __future__ import annotations

import logging
from typing import Any

from daskcollect import _internals
from daskcollect.collection.polling import apoll_until
from daskcollect.leases.scheduler import HandlerPlugin
from daskcollect.retirement import ACTOR_KEY_PREFIX, RETIREMENT_PLUGIN, RETIRING_TOPIC

logger = logging.getLogger(__name__)


def collector_actors(scheduler: Any, address: str) -> list[str]:
    """Keys of the daskcollect actors that the worker at ``address`` holds."""
    return [k for k in _internals.actor_keys(scheduler, address) if k.startswith(ACTOR_KEY_PREFIX)]


def _named(name: str, wanted: set[str]) -> bool:
    """Whether a worker is one of ``wanted``, or one of the processes of a job named in it.

    dask-jobqueue names the workers of a multi-process job ``<job>-<i>`` and
    scales down by job name.
    """
    return name in wanted or name.rsplit("-", 1)[0] in wanted


class GracefulRetirement(HandlerPlugin):
    """Lets daskcollect release its actors before Dask retires their workers.

    Leased by every ``DaskCollector``. With no collector actor on the leaving
    workers it hands the call to Dask's handler unchanged. ``close()`` restores
    Dask's handler.

    Args:
        timeout: How long a retirement waits for the collectors' release
            (``daskcollect.timeouts.retire`` of the first collection that registered it).
    """

    name = RETIREMENT_PLUGIN

    handler = "retire_workers"

    def __init__(self, timeout: float = 60.0) -> None:
        super().__init__()
        self.timeout = timeout

    def _targets(self, kwargs: dict[str, Any]) -> list[str]:
        """The addresses Dask's ``retire_workers`` would retire for these arguments."""
        scheduler = self.scheduler
        # SpecCluster.scale passes worker *names* as workers=: Dask then retires
        # nothing and closes them anyway, so names count here too.
        given = kwargs.get("workers") if kwargs.get("workers") is not None else kwargs.get("names")
        if given is not None:
            wanted = {str(w) for w in given}
            names = _internals.worker_addresses_by_name(scheduler)
            return [a for a, name in names.items() if a in wanted or _named(name, wanted)]
        return _internals.workers_to_close(scheduler, kwargs.get("n"), kwargs.get("memory_ratio"))

    async def handle(self, kwargs: dict[str, Any]) -> Any:
        scheduler = self.scheduler
        kwargs.pop("comm", None)
        targets = self._targets(kwargs)
        busy = [a for a in targets if collector_actors(scheduler, a)]
        if busy:
            if kwargs.get("workers") is None and kwargs.get("names") is None:
                # Retire exactly the workers announced, not a new choice after the wait.
                kwargs = {k: v for k, v in kwargs.items() if k not in ("n", "memory_ratio")}
                kwargs["workers"] = targets
            scheduler.log_event(RETIRING_TOPIC, {"workers": busy})
            released = await apoll_until(
                lambda: not any(collector_actors(scheduler, a) for a in busy), self.timeout
            )
            if not released:
                logger.warning(
                    "daskcollect: collectors on %s were not released within %gs "
                    "(daskcollect.timeouts.retire); Dask will refuse to retire those workers",
                    busy,
                    self.timeout,
                )
        if busy and _internals.is_self_retirement(kwargs):
            # Dask removes the worker at once, before the worker closes; a heartbeat
            # in between is answered "missing", and the worker then closes its
            # nanny too, so a --lifetime-restart worker never comes back
            # (dask/distributed#4752). Removed when it disconnects, it cannot race.
            kwargs["remove"] = False
        return await self.original(**kwargs)
