"""The private cluster of a collection given no cluster: a ``LocalCluster``'s layout, run from the driver.

Runs on the driver. Its scheduler runs in a child process
(:class:`~daskcollect.deploy.scheduler_process.SchedulerProcess`), its nannies on
the driver's event loop (:class:`DriverNanny`), and its workers in processes of
their own, forked from a server process that imported the collector stack once
(``daskcollect.local-cluster.worker-start: forkserver``, :func:`forkserver`).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.forkserver
import os
from typing import Any

import dask.config
from distributed import LocalCluster, Nanny, SpecCluster
from distributed.security import Security

from daskcollect import _internals
from daskcollect.collection.options import ClusterOptions
from daskcollect.deploy.scheduler_process import SchedulerProcess
from daskcollect.errors import ClusterConnectionError, ConfigurationError
from daskcollect.settings import Settings

NANNY_MONITORS = ("monitor", "tick", "ticks", "shift_counters")

#: What the forkserver imports before it forks the first worker: a worker then builds its collector
#: without importing torch, tensordict, TorchRL or gymnasium again.
PRELOAD = ["distributed", "gymnasium", "daskcollect.worker.actor"]


def forkserver() -> bool:
    """Starts this process's ``multiprocessing`` forkserver with :data:`PRELOAD` (once; a forkserver
    already running, with the preload it was given, is kept); ``False`` where the platform has none."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    # What Dask's nannies set before they spawn (OMP_NUM_THREADS, MALLOC_TRIM_THRESHOLD_...) is read at
    # a process's start or its imports: here, the forkserver's. Dask sets them in this process too.
    pre_spawn = dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}
    os.environ.update({key: str(value) for key, value in pre_spawn.items() if value is not None})
    # Started now, before Dask's first use sets a preload of its own (Dask's modules only).
    multiprocessing.forkserver.ensure_running()
    return True


class DriverNanny(Nanny):
    """A private cluster's nanny, without its own process monitors.

    Every nanny of a private ``LocalCluster`` runs in the driver's process, on
    its event loop. Each would sample that same process (psutil) and time that
    same loop every few seconds: at 16 workers, 9 to 17 of the 26 to 32 ms of
    CPU a second that an idle private cluster cost the driver
    (docs/benchmarks.md, P7). The nanny's own work (starting, restarting and
    watching its worker process) is untouched, and each worker still monitors
    its own process.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _internals.drop_periodic_callbacks(self, NANNY_MONITORS)


class PrivateCluster(SpecCluster):
    """A ``SpecCluster`` that stops its event loop when its start fails (``SpecCluster`` closes what it
    started then, but leaves the loop's thread running for the life of the process)."""

    def __init__(self, *args: Any, **kwargs: Any):
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            _internals.stop_loop(self)
            raise


def _private_cluster(kwargs: dict[str, Any], scheduler_timeout: float) -> SpecCluster:
    """A ``LocalCluster``'s layout from Dask's public ``SpecCluster`` specs, its scheduler in a child
    process (:class:`SchedulerProcess`): the same scheduler and nanny options that ``LocalCluster``
    would build from ``kwargs`` (its keywords, as :func:`local_cluster` gives them)."""
    security = kwargs["security"]
    if security is None:
        security = Security()
    elif security is True:
        security = Security.temporary()
    protocol = "tls://" if security.require_encryption else "tcp://"
    dashboard = kwargs["dashboard_address"]
    scheduler = {
        "cls": SchedulerProcess,
        "options": dict(
            host=kwargs["host"], security=security, protocol=protocol, dashboard=dashboard is not None,
            dashboard_address=dashboard, timeout=scheduler_timeout,
        ),
    }  # fmt: skip
    worker = {
        "cls": kwargs["worker_class"],
        "options": dict(
            host=kwargs["host"], nthreads=kwargs["threads_per_worker"], memory_limit=kwargs["memory_limit"],
            resources=kwargs["resources"], security=security, protocol=protocol, dashboard=False,
            silence_logs=logging.WARN, env=kwargs["env"],
        ),
    }  # fmt: skip
    return PrivateCluster(
        scheduler=scheduler,
        workers=dict.fromkeys(range(kwargs["n_workers"]), worker),
        worker=worker,
        security=security,
        silence_logs=logging.WARN,
    )


def local_cluster(options: ClusterOptions, n_workers: int, settings: Settings) -> SpecCluster:
    kwargs: dict[str, Any] = dict(
        n_workers=n_workers,
        worker_class=DriverNanny,
        threads_per_worker=1,
        processes=True,
        host=settings.local_host,
        dashboard_address=settings.local_dashboard_address,
        memory_limit=settings.local_memory_limit,
        resources=dict(options.worker_resources) if options.worker_resources else None,
        security=options.security,
        # A worker forked from the forkserver would see the environment of the moment the server
        # started; it gets the driver's of now, as a spawned one would.
        env=dict(os.environ),
    )
    method = "forkserver" if settings.local_worker_start == "forkserver" and forkserver() else "spawn"
    try:
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            if not settings.local_scheduler_process:
                return LocalCluster(**kwargs)
            return _private_cluster(kwargs, scheduler_timeout=settings.timeouts.connect)
    except RuntimeError as exc:  # SpecCluster wraps what failed its start
        if isinstance(exc.__cause__, (ClusterConnectionError, ConfigurationError)):
            raise exc.__cause__ from None
        raise
