"""The WorkerPlugin that prepares each worker for its collector.

Unlike ``distributed.diagnostics.plugin.Environ``, it sets environment
variables in the running process, so no worker restarts and no actor dies.
It is registered before any actor is built, and removed at shutdown, which
restores the variables it changed.
"""

from __future__ import annotations

import os
import sys

from distributed.diagnostics.plugin import WorkerPlugin


def foreign_scratch_dirs(paths: list[str], own: str | None) -> list[str]:
    """The ``sys.path`` entries that are other Dask nodes' scratch directories.

    A worker spawned by a LocalCluster inherits the driver's ``sys.path``, which
    holds the scheduler's scratch directory and the scratch root. They serve no
    purpose on the worker, and each entry costs a ``stat`` on every failed
    module lookup: tensordict looks ``pandas`` up on each policy call, so three
    such entries cost about 5% of CartPole throughput (docs/performance.md).
    """
    out = []
    for path in paths:
        name, parent = os.path.basename(path), os.path.basename(os.path.dirname(path))
        if path != own and (name == "dask-scratch-space" or parent == "dask-scratch-space"):
            out.append(path)
    return out


class WorkerSetup(WorkerPlugin):
    """Sets ``worker_env`` and torch's thread count on every worker.

    Args:
        env: Environment variables to set.
        torch_threads: Value for ``torch.set_num_threads``; ``None`` leaves it.
        trim_sys_path: Drop other Dask nodes' scratch directories from ``sys.path``.
    """

    idempotent = True

    def __init__(
        self, env: dict[str, str] | None = None, torch_threads: int | None = 1, trim_sys_path: bool = True
    ):
        self.env = dict(env or {})
        self.torch_threads = torch_threads
        self.trim_sys_path = trim_sys_path
        self._saved: dict[str, str | None] = {}
        self._trimmed: list[str] = []

    def setup(self, worker):
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        if self.torch_threads is not None:
            import torch

            torch.set_num_threads(self.torch_threads)
        if self.trim_sys_path:
            self._trimmed = foreign_scratch_dirs(sys.path, getattr(worker, "local_directory", None))
            sys.path[:] = [p for p in sys.path if p not in self._trimmed]

    def teardown(self, worker):
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = {}
        sys.path.extend(p for p in self._trimmed if p not in sys.path)
        self._trimmed = []
