"""The WorkerPlugin that prepares each worker for its collector.

Unlike ``distributed.diagnostics.plugin.Environ``, it sets environment
variables in the running process, so no worker restarts and no actor dies.
It is registered before any actor is built, and removed at shutdown, which
restores the variables it changed.
"""

from __future__ import annotations

import os

from distributed.diagnostics.plugin import WorkerPlugin


class WorkerSetup(WorkerPlugin):
    """Sets ``worker_env`` and torch's thread count on every worker.

    Args:
        env: Environment variables to set.
        torch_threads: Value for ``torch.set_num_threads``; ``None`` leaves it.
    """

    idempotent = True

    def __init__(self, env: dict[str, str] | None = None, torch_threads: int | None = 1):
        self.env = dict(env or {})
        self.torch_threads = torch_threads
        self._saved: dict[str, str | None] = {}

    def setup(self, worker):
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        if self.torch_threads is not None:
            import torch

            torch.set_num_threads(self.torch_threads)

    def teardown(self, worker):
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = {}
