"""Helpers that tests import by name (``from helpers import ...``; ``conftest`` is two modules here)."""

from __future__ import annotations

import os
import time

import psutil
from distributed import Client


def children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.1) -> bool:
    """Polls ``predicate`` until it is true or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def actors_on(client: Client) -> dict[str, list[str]]:
    """The actor keys held by each worker."""
    return client.run(lambda dask_worker: [str(k) for k in dask_worker.state.actors])


def collector_keywords(**overrides) -> dict:
    """Every keyword of ``DaskCollector`` at its default, for building a spec without a cluster."""
    import inspect

    from daskcollect import DaskCollector
    from daskcollect.testing import make_cartpole

    params = inspect.signature(DaskCollector.__init__).parameters
    kw = {n: p.default for n, p in params.items() if n not in ("self", "ray_only")}
    kw.update(create_env_fn=make_cartpole, policy=None, frames_per_batch=100, ray_only={})
    kw.update(overrides)
    return kw
