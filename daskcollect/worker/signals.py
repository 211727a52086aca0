"""Signals that retire a collector's worker gracefully: SLURM's notices of the end of a job.

SLURM ends a job (``scancel``, preemption, walltime) with SIGTERM to every
process of the job, then SIGKILL after ``KillWait`` or the preemption
``GraceTime``; ``#SBATCH --signal=B:USR1@120`` asks for an earlier notice.
Left to Dask, SIGTERM closes a worker at once: ``dask worker`` closes its
nanny, which stops the worker process, and a worker process spawned by a
nanny has no handler and dies. The collector's rollout in flight is lost.

While a collection is registered on a worker, these handlers turn the
signals into the path a worker's ``--lifetime`` takes:

- in the worker process, ``Worker.close_gracefully``, which goes through
  ``Scheduler.retire_workers`` and so through daskcollect's retirement hook
  (:mod:`daskcollect.retirement`): the driver lets the rollout in flight
  finish and yields it, starts none there, and replaces the collector;
- in the nanny, a graceful close (it will not restart the worker) and the
  signal forwarded to its worker process, for notices that reach the nanny
  alone (``--signal=B:`` signals only the job's batch shell, which is the
  nanny when the job script ``exec``\\ s ``dask worker``).

Handlers are per process: the first collection installs them, the last one
out restores what was there. They go only where a signal means "this worker
ends": a worker process that a nanny or ``dask worker`` started, and the
nanny of ``dask worker``; never a driver's process that hosts a
``LocalCluster``'s nannies or threads (``signal.signal`` also works only in a
process's main thread). Nothing is logged inside a signal handler (it may interrupt
logging itself); the work is scheduled on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

from distributed.diagnostics.plugin import NannyPlugin

from daskcollect import _internals

logger = logging.getLogger(__name__)

#: The start of every daskcollect nanny plugin's name (how the driver knows to remove it as one).
NANNY_PLUGIN_PREFIX = "daskcollect-nanny-"

#: Worker and nanny statuses in which a signal has nothing left to start.
_CLOSING = {"closing", "closing_gracefully", "closed", "failed"}


class _Handlers:
    """This process's signal handlers, installed while at least one collection holds them."""

    def __init__(self) -> None:
        self.holders: set[str] = set()
        self.previous: dict[int, Any] = {}

    def acquire(self, token: str, names: Iterable[str], action: Callable[[int], None], here: bool) -> None:
        """Installs ``action`` for the named signals, once per process (nowhere else: see ``here``).

        Args:
            token: Names the collection that holds them.
            names: Signal names, such as ``"SIGTERM"``.
            action: Run on the event loop with the signal's number.
            here: Whether this process is one where the signals mean the worker's end.
        """
        if not here or threading.current_thread() is not threading.main_thread():
            return
        if not self.holders:
            loop = asyncio.get_running_loop()

            def handler(signum: int, frame: Any) -> None:
                loop.call_soon_threadsafe(action, signum)

            for name in names:
                signum = signal.Signals[name]
                self.previous[signum] = signal.signal(signum, handler)
        self.holders.add(token)

    def release(self, token: str) -> None:
        """Restores the handlers that were there once the last holder leaves."""
        self.holders.discard(token)
        if self.holders or not self.previous:
            return
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        self.previous.clear()


#: The worker process's handlers (held by :class:`~daskcollect.worker.plugin.WorkerSetup`).
WORKER_HANDLERS = _Handlers()
#: The nanny process's handlers (held by :class:`NannySignals`).
NANNY_HANDLERS = _Handlers()


def worker_process() -> bool:
    """Whether this process is a worker's own: started by a nanny or by ``dask worker``."""
    return multiprocessing.parent_process() is not None or _internals.runs_dask_worker_cli()


def retire_worker_on(worker: Any) -> Callable[[int], None]:
    """The worker process's action: close gracefully, without restarting, once.

    The same notice often comes twice (from SLURM, and forwarded by the nanny)
    before the scheduler has marked the worker as closing: only the first counts.
    """
    started = []

    def action(signum: int) -> None:
        if started or worker.status.name in _CLOSING:
            return
        started.append(signum)
        name = signal.Signals(signum).name
        logger.warning("daskcollect: %s received: worker %s retires gracefully", name, worker.address)
        asyncio.ensure_future(worker.close_gracefully(restart=False, reason=f"daskcollect-{name}"))

    return action


def forward_from_nanny(nanny: Any) -> Callable[[int], None]:
    """The nanny's action: stop restarting the worker, and pass the signal on to it."""

    def action(signum: int) -> None:
        if nanny.status.name not in _CLOSING:
            nanny.close_gracefully(reason=f"daskcollect-{signal.Signals(signum).name}")
        pid = nanny.pid
        if pid:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass  # the worker process has already gone; the nanny closes after it

    return action


class NannySignals(NannyPlugin):
    """Installs the nanny's handlers (see the module's docstring); restores them at teardown.

    Args:
        signals: Signal names, such as ``"SIGTERM"``.
        token: Names the collection that holds them.
    """

    def __init__(self, signals: Iterable[str], token: str) -> None:
        self.signals = tuple(signals)
        self.token = token

    def setup(self, nanny: Any) -> None:
        NANNY_HANDLERS.acquire(
            self.token, self.signals, forward_from_nanny(nanny), here=_internals.runs_dask_worker_cli()
        )

    def teardown(self, nanny: Any) -> None:
        NANNY_HANDLERS.release(self.token)
