"""Graceful retirement of workers that host collectors: a scheduler plugin.

Dask refuses to retire a worker that holds an actor (an actor cannot move), and
``SpecCluster.scale`` down, ``Adaptive``, ``Client.retire_workers`` and a
worker's ``--lifetime`` all go through ``Scheduler.retire_workers``. A refused
retirement of a scaled-down worker is followed by a plain close, so the
collector's rollout in flight would be lost.

:class:`GracefulRetirement` wraps the scheduler's ``retire_workers`` handler.
Before Dask's own retirement starts, it announces the leaving workers on the
:data:`TOPIC` event topic and waits (bounded by
``daskcollect.timeouts.retire``) until every daskcollect actor on them has been
released. Each ``DaskCollector`` listens on that topic: it stops sending calls
to those collectors, lets the calls in flight finish (their batches are
yielded as usual), closes the collectors and releases the actors. Dask's
retirement then proceeds as for any worker. Without daskcollect actors on the
leaving workers, the handler is Dask's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskcollect import config

logger = logging.getLogger(__name__)

TOPIC = "daskcollect-retiring"
ACTOR_KEY_PREFIX = "daskcollect-actor-"
PLUGIN_NAME = "daskcollect-graceful-retirement"


def collector_actors(scheduler: Any, address: str) -> list[str]:
    """Keys of the daskcollect actors that the worker at ``address`` holds."""
    ws = scheduler.workers.get(address)
    if ws is None:
        return []
    return [str(ts.key) for ts in ws.actors if str(ts.key).startswith(ACTOR_KEY_PREFIX)]


def _named(name: str, wanted: set[str]) -> bool:
    """Whether a worker is one of ``wanted``, or one of the processes of a job named in it.

    dask-jobqueue names the workers of a multi-process job ``<job>-<i>`` and
    scales down by job name.
    """
    return name in wanted or name.rsplit("-", 1)[0] in wanted


class GracefulRetirement(SchedulerPlugin):
    """Lets daskcollect release its actors before Dask retires their workers.

    Registered (idempotently) by every ``DaskCollector``; inert when no
    collector actor is on a leaving worker. ``close()`` restores Dask's handler.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self._scheduler: Any = None
        self._original: Any = None

    async def start(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        current = scheduler.handlers["retire_workers"]
        if getattr(current, "_daskcollect", False):
            return  # another instance already wrapped it
        self._original = current

        async def retire_workers(**kwargs: Any) -> Any:
            return await self._retire(kwargs)

        retire_workers._daskcollect = True  # type: ignore[attr-defined]
        scheduler.handlers["retire_workers"] = retire_workers

    async def close(self) -> None:
        if self._scheduler is not None and self._original is not None:
            self._scheduler.handlers["retire_workers"] = self._original
            self._original = None

    def _targets(self, kwargs: dict[str, Any]) -> list[str]:
        """The addresses Dask's ``retire_workers`` would retire for these arguments."""
        scheduler = self._scheduler
        # SpecCluster.scale passes worker *names* as workers=: Dask then retires
        # nothing and closes them anyway, so names count here too.
        given = kwargs.get("workers") if kwargs.get("workers") is not None else kwargs.get("names")
        if given is not None:
            wanted = {str(w) for w in given}
            return [a for a, ws in scheduler.workers.items() if a in wanted or _named(str(ws.name), wanted)]
        return list(scheduler.workers_to_close(n=kwargs.get("n"), memory_ratio=kwargs.get("memory_ratio")))

    async def _retire(self, kwargs: dict[str, Any]) -> Any:
        scheduler = self._scheduler
        kwargs.pop("comm", None)
        targets = self._targets(kwargs)
        busy = [a for a in targets if collector_actors(scheduler, a)]
        if busy:
            if kwargs.get("workers") is None and kwargs.get("names") is None:
                # Retire exactly the workers announced, not a new choice after the wait.
                kwargs = {k: v for k, v in kwargs.items() if k not in ("n", "memory_ratio")}
                kwargs["workers"] = targets
            scheduler.log_event(TOPIC, {"workers": busy})
            timeout = config.timeout("retire")
            deadline = time.monotonic() + timeout
            while any(collector_actors(scheduler, a) for a in busy):
                if time.monotonic() > deadline:
                    logger.warning(
                        "daskcollect: collectors on %s were not released within %gs "
                        "(daskcollect.timeouts.retire); Dask will refuse to retire those workers",
                        busy,
                        timeout,
                    )
                    break
                await asyncio.sleep(0.05)
        return await self._original(**kwargs)


def register(client: Any) -> bool:
    """Installs :class:`GracefulRetirement` on the client's scheduler (once per scheduler).

    Returns:
        ``False``, with a warning, where the scheduler cannot load it (daskcollect
        not installed beside the scheduler): retiring a collector's worker then
        loses the rollout in flight, as a lost worker does.
    """
    try:
        client.register_plugin(GracefulRetirement(), name=PLUGIN_NAME)
    except Exception as exc:
        warnings.warn(
            f"daskcollect could not install its retirement hook on the scheduler ({type(exc).__name__}: "
            f"{exc}). Workers that retire gracefully will lose their collector's rollout in flight. "
            "Install daskcollect in the scheduler's environment to avoid it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True
