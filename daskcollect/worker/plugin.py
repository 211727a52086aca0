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

from distributed.diagnostics.plugin import WorkerPlugin

from daskcollect import _internals
from daskcollect.settings import WorkerSettings

#: The names of the requests daskcollect adds to its workers (completion streams, the weights' tree).
HANDLER_PREFIX = "daskcollect_"


def _load_collector_stack(torch_threads: int | None) -> None:
    """Imports what collectors need, registers the serializers, sets torch's threads (off the loop)."""
    import torch

    import daskcollect.worker.actor  # noqa: F401  (torch, tensordict, TorchRL, before the first actor)
    from daskcollect.serialization import register_serializers

    register_serializers()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)


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


class WorkerSetup(WorkerPlugin):
    """Registers daskcollect's serializer, sets ``worker_env`` and torch's thread count on every worker.

    Args:
        env: Environment variables to set.
        settings: ``daskcollect.worker.*``: torch threads (``None`` leaves
            them), whether to drop other Dask nodes' scratch directories from
            ``sys.path``, and the worker's event-loop tick while the plugin is
            registered (Dask's 20 ms default wakes the event loop, which then
            takes the GIL from the rollout thread, 50 times a second; ``None``
            leaves it).
    """

    idempotent = True

    def __init__(self, env: dict[str, str] | None = None, settings: WorkerSettings | None = None):
        self.env = dict(env or {})
        settings = settings or WorkerSettings()
        self.torch_threads = settings.torch_threads
        self.trim_sys_path = settings.trim_sys_path
        self.tick_interval = settings.tick_interval
        self._saved: dict[str, str | None] = {}
        self._trimmed: list[tuple[int, str]] = []  # (position, entry), to put each back where it was
        self._tick_ms: float | None = None
        self._quiet: _internals.QuietHeartbeatAtClose | None = None

    async def setup(self, worker):
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)  # before any import reads them
        await asyncio.get_running_loop().run_in_executor(None, _load_collector_stack, self.torch_threads)
        if self.trim_sys_path:
            foreign = set(foreign_scratch_dirs(sys.path, getattr(worker, "local_directory", None)))
            self._trimmed = [(i, p) for i, p in enumerate(sys.path) if p in foreign]
            sys.path[:] = [p for p in sys.path if p not in foreign]
        tick = _internals.tick_callback(worker) if worker is not None else None
        if self.tick_interval is not None and tick is not None:
            self._tick_ms = tick.callback_time
            tick.callback_time = self.tick_interval * 1000  # read at the next scheduling
        if worker is not None:
            self._quiet = _internals.QuietHeartbeatAtClose(worker)
            logging.getLogger("distributed.worker").addFilter(self._quiet)

    @staticmethod
    def _forget(worker) -> None:
        """What the collectors added to the worker, once no collection uses it: the requests their
        streams and the weights' tree answer, and the weights copies the tree holds."""
        _internals.remove_handlers(worker, HANDLER_PREFIX)
        tree = sys.modules.get("daskcollect.weights.tree")
        if tree is not None:
            tree.forget_all()

    def teardown(self, worker):
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = {}
        for position, path in self._trimmed:
            if path not in sys.path:
                sys.path.insert(position, path)
        self._trimmed = []
        tick = _internals.tick_callback(worker) if worker is not None else None
        if self._tick_ms is not None and tick is not None:
            tick.callback_time = self._tick_ms
        self._tick_ms = None
        if worker is not None and not any(isinstance(p, WorkerSetup) for p in worker.plugins.values()):
            self._forget(worker)
        # A closing worker runs this before it closes its connections: the filter stays for that.
        if self._quiet is not None and not self._quiet.closing():
            logging.getLogger("distributed.worker").removeFilter(self._quiet)
            self._quiet = None
