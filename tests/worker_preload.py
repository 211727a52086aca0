"""A Dask worker preload of the test clusters (``tests/conftest.py``): sub-processes start as in production.

A worker forked from the session's forkserver inherits ``forkserver`` as its
start method; one started by Dask's default method has ``spawn``, and so do the
sub-processes that TorchRL starts in it (``ParallelEnv``, ``MultiSyncCollector``).
"""

from __future__ import annotations

import multiprocessing


def dask_setup(worker) -> None:
    multiprocessing.set_start_method("spawn", force=True)
