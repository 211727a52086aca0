"""Checks for your own tests: that a collection leaves a shared cluster as it found it.

daskcollect removes what it adds to a cluster when the last collection using
it shuts down (plugins, handlers, dashboard routes, stored weights, actors).
On a cluster you share with other work, you can check that in your own test
suite:

    from daskcollect.testing import cluster_state, differences

    before = cluster_state(client)
    with DaskCollector(make_env, policy, frames_per_batch=200, total_frames=1000, client=client) as c:
        for batch in c:
            ...
    assert differences(before, cluster_state(client)) == []

The state covers the scheduler's plugins, handlers, ``retire_workers``
handler, dashboard routes, event subscriptions, tasks and published datasets, and on each worker
its plugins, handlers, data keys, actors, log filters, environment,
``sys.path`` and event-loop tick. Each worker first imports torch, tensordict,
TorchRL's collectors and gymnasium (where installed), so that what importing
them changes is not counted against the collection.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

from daskcollect import _internals

#: Imported on every worker before its state is read, where installed: importing them changes a process
#: for good (TorchRL's import of Ray adds to ``sys.path``), which is not a collection's doing.
IMPORTS = ("torch", "tensordict", "torchrl.collectors", "gymnasium")
#: Set by importing pygame (a gymnasium renderer may import it late), not by a collection.
IMPORT_SIDE_EFFECTS = ("PYGAME_HIDE_SUPPORT_PROMPT",)


def scheduler_state(dask_scheduler: Any) -> dict[str, Any]:
    """What a collection could leave behind on the scheduler (run there by :func:`cluster_state`)."""
    return {
        "plugins": _internals.scheduler_plugin_names(dask_scheduler),
        "handlers": _internals.handler_names(dask_scheduler),
        "retire_workers": repr(_internals.scheduler_handler(dask_scheduler, "retire_workers")),
        "routes": _internals.route_counts(dask_scheduler),
        "subscriptions": _internals.subscribed_topics(dask_scheduler),
        "tasks": _internals.task_keys(dask_scheduler),
        "datasets": _internals.published_datasets(dask_scheduler),
    }


def worker_state(
    dask_worker: Any, ignore_env: Iterable[str] = IMPORT_SIDE_EFFECTS, imports: Iterable[str] = IMPORTS
) -> dict[str, Any]:
    """What a collection could leave behind in a worker process (run there by :func:`cluster_state`)."""
    for name in imports:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # not installed on this worker: a collection cannot have imported it either
    ignored = set(ignore_env)
    return {
        "plugins": sorted(_internals.worker_plugins(dask_worker)),
        "handlers": _internals.handler_names(dask_worker),
        "data": _internals.data_keys(dask_worker),
        "actors": _internals.held_actors(dask_worker),
        "log filters": [repr(f) for f in logging.getLogger("distributed.worker").filters],
        "environment": {k: v for k, v in os.environ.items() if k not in ignored},
        "sys.path": list(sys.path),
        "tick": _internals.tick_callback(dask_worker).callback_time,
    }


def cluster_state(
    client: Any,
    timeout: float = 30.0,
    ignore_env: Iterable[str] = IMPORT_SIDE_EFFECTS,
    imports: Iterable[str] = IMPORTS,
) -> dict[str, Any]:
    """The scheduler's and every worker's state, to compare before and after a collection.

    Args:
        client: A ``distributed.Client`` on the cluster.
        timeout: Bound, in seconds, on each of the two round trips.
        ignore_env: Environment variables left out of the workers' state
            (set by imports, for example).
        imports: Modules each worker imports first, where installed: a
            module stays imported, and what its import changes is not the
            collection's doing. Add the modules your envs import.
    """
    return {
        "scheduler": client.run_on_scheduler(scheduler_state, callback_timeout=timeout),
        "workers": client.run(
            worker_state, ignore_env=tuple(ignore_env), imports=tuple(imports), callback_timeout=timeout
        ),
    }


def differences(before: dict[str, Any], after: dict[str, Any], where: str = "") -> list[str]:
    """What changed between two :func:`cluster_state` results, one line per leaf.

    Returns:
        ``"/path: before -> after"`` lines, or for lists the items removed and
        added; an empty list when nothing changed.
    """
    out = []
    for key in sorted(set(before) | set(after), key=str):
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{where}/{key}")
        elif isinstance(a, list) and isinstance(b, list) and a != b:
            out.append(
                f"{where}/{key}: removed {[x for x in a if x not in b]}, added {[x for x in b if x not in a]}"
                + ("" if sorted(map(str, a)) != sorted(map(str, b)) else " (order)")
            )
        elif a != b:
            out.append(f"{where}/{key}: {a!r} -> {b!r}")
    return out


def state_sizes(collector: Any) -> dict[str, int]:
    """How many entries each per-collector structure of an open ``DaskCollector`` holds on the driver.

    A long run that follows a cluster whose workers come and go keeps these
    flat: what is kept for a collector goes when it leaves for good. Use it to
    check a collection of your own over many joins and leaves.
    """
    return collector.session.sizes()
