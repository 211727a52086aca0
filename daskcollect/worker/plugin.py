"""The WorkerPlugin that prepares each worker for its collector.

Unlike ``distributed.diagnostics.plugin.Environ``, it sets environment
variables in the running process, so no worker restarts and no actor dies.
It is registered before any actor is built, and removed at shutdown, which
restores the variables it changed.

Importing torch, tensordict and TorchRL takes seconds. The plugin's module
imports none of them, and :meth:`WorkerSetup.setup` imports them in a thread:
a worker whose event loop stalled that long would miss its heartbeats, and a
scheduler with a short ``worker-ttl`` would remove it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from daskcollect import _internals
from daskcollect.settings import WorkerSettings
from daskcollect.worker.layers import LAYERS, Layer
from daskcollect.worker.signals import WORKER_HANDLERS, retire_worker_on, worker_process

#: The names of the requests daskcollect adds to its workers (completion streams, the weights' tree).
HANDLER_PREFIX = "daskcollect_"


def _load_collector_stack(torch_threads: int | None) -> None:
    """Imports what collectors need, registers the serializers, sets torch's threads (off the loop)."""
    import torch

    import daskcollect.worker.actor  # noqa: F401  (torch, tensordict, TorchRL, before the first actor)
    from daskcollect.streams.serialization import register_serializers

    register_serializers()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)


def _serve(worker: Any) -> None:
    """Adds the requests that collectors' streams and the weights' tree answer (idempotent; the last
    collection out removes them, so an actor whose build ends after that adds nothing back).

    Both modules are light (``daskcollect.worker.actor`` imports them). The inference servers' handler
    is left to each server: its module imports TorchRL, which the actors' threads import meanwhile,
    and two threads importing TorchRL by different entry points fail on its circular imports.
    """
    from daskcollect.streams import worker as stream
    from daskcollect.weights import tree

    tree.install(worker)  # this worker may pass weights on to other hosts' workers
    stream.install(worker)  # the driver takes its collectors' rollouts over a stream


def foreign_scratch_dirs(paths: list[str], own: str | None) -> list[str]:
    """The ``sys.path`` entries that are other Dask nodes' scratch directories.

    A worker spawned by a LocalCluster inherits the driver's ``sys.path``, which
    holds the scheduler's scratch directory and the scratch root. They serve no
    purpose on the worker, and each entry costs a ``stat`` on every failed
    module lookup: tensordict looks ``pandas`` up on each policy call, so three
    such entries cost about 5% of CartPole throughput (docs/benchmarks.md).
    """
    out = []
    for path in paths:
        name, parent = os.path.basename(path), os.path.basename(os.path.dirname(path))
        if path != own and (name == "dask-scratch-space" or parent == "dask-scratch-space"):
            out.append(path)
    return out


#: What the first collection on this worker changed for all of them, put back by the last one out: the
#: ``sys.path`` entries dropped (each with its position) and the heartbeat log filter.
_shared: dict[str, Any] = {"trimmed": [], "quiet": None}


class WorkerSetup(WorkerPlugin):
    """Registers daskcollect's serializer, sets ``worker_env`` and torch's thread count on every worker.

    Each collection registers its own. They compose: the variables and the
    event-loop tick are layers over what the first one found
    (:mod:`daskcollect.worker.layers`), so collections that share workers
    close in any order and leave each worker as found.

    Args:
        env: Environment variables to set.
        settings: ``daskcollect.worker.*``: torch threads (``None`` leaves
            them), whether to drop other Dask nodes' scratch directories from
            ``sys.path``, and the worker's event-loop tick while the plugin is
            registered (Dask's 20 ms default wakes the event loop, which then
            takes the GIL from the rollout thread, 50 times a second; ``None``
            leaves it); and the signals that retire the worker gracefully
            (:mod:`daskcollect.worker.signals`).
    """

    idempotent = True

    def __init__(self, env: dict[str, str] | None = None, settings: WorkerSettings | None = None):
        self.env = dict(env or {})
        settings = settings or WorkerSettings()
        self.torch_threads = settings.torch_threads
        self.trim_sys_path = settings.trim_sys_path
        self.tick_interval = settings.tick_interval
        self.retire_signals = settings.retire_signals
        #: Names this collection's layer on every worker (the plugin travels pickled).
        self.token = uuid.uuid4().hex

    async def setup(self, worker):
        first = len(LAYERS) == 0
        tick_ms = None if self.tick_interval is None else self.tick_interval * 1000
        tick = _internals.tick_callback(worker) if worker is not None else None
        LAYERS.push(self.token, Layer(self.env, tick_ms), tick)  # before any import reads the variables
        if worker is not None and self.retire_signals:
            WORKER_HANDLERS.acquire(
                self.token, self.retire_signals, retire_worker_on(worker), worker_process()
            )
        await asyncio.get_running_loop().run_in_executor(None, _load_collector_stack, self.torch_threads)
        if worker is not None:
            _serve(worker)
        if not first:
            return
        if self.trim_sys_path:
            foreign = set(foreign_scratch_dirs(sys.path, getattr(worker, "local_directory", None)))
            _shared["trimmed"] = [(i, p) for i, p in enumerate(sys.path) if p in foreign]
            sys.path[:] = [p for p in sys.path if p not in foreign]
        if worker is not None:
            _shared["quiet"] = _internals.QuietHeartbeatAtClose(worker)
            logging.getLogger("distributed.worker").addFilter(_shared["quiet"])

    @staticmethod
    def _forget(worker) -> None:
        """What the collectors added to the worker, once no collection uses it: the requests their
        streams and the weights' tree answer, and the weights copies the tree holds."""
        _internals.remove_handlers(worker, HANDLER_PREFIX)
        tree = sys.modules.get("daskcollect.weights.tree")
        if tree is not None:
            tree.forget_all()

    def teardown(self, worker):
        tick = _internals.tick_callback(worker) if worker is not None else None
        WORKER_HANDLERS.release(self.token)
        if not LAYERS.pop(self.token, tick):
            return  # another collection still uses this worker
        for position, path in _shared["trimmed"]:
            if path not in sys.path:
                sys.path.insert(position, path)
        _shared["trimmed"] = []
        if worker is not None:
            self._forget(worker)
        quiet = _shared["quiet"]
        # A closing worker runs this before it closes its connections: the filter stays for that.
        if quiet is not None and not quiet.closing():
            logging.getLogger("distributed.worker").removeFilter(quiet)
            _shared["quiet"] = None
