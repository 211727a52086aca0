"""The leak check that runs after every test (``tests/conftest.py``): what a test left behind.

A leak fails the test that caused it, not a later one that trips over it. The
check looks at this machine (processes, daskcollect's shared-memory files and
threads) and, once the session's cluster exists, at that cluster (daskcollect
actors and worker plugins, scheduler plugins and tasks). Whatever is still there
after a bounded wait is reported, and leftover processes are killed so that the
next test starts clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable

import psutil
from distributed import Client, SpecCluster
from helpers import SHARED_MEMORY, wait_until

PREFIX = "daskcollect"

#: Seconds a leftover may take to go on its own (a private cluster's processes exiting,
#: the scheduler forgetting a closed client's tasks) before it counts as a leak.
GRACE = 15.0

#: Seconds the session's cluster has to answer the check.
ANSWER = 10.0

Footprint = dict[str, set]


def descendants() -> dict[int, psutil.Process]:
    """This process's live descendants, by pid (a zombie is over: it only waits to be reaped)."""
    out = {}
    for process in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                out[process.pid] = process
        except psutil.NoSuchProcess:
            pass
    return out


def threads() -> set[str]:
    """daskcollect's threads, and Dask's event-loop threads (a Client or cluster not closed)."""
    return {
        f"{t.name} ({t.ident})"
        for t in threading.enumerate()
        if t.name.startswith(PREFIX) or t.name == "IO loop"
    }


def creator(name: str) -> int | None:
    """The pid in a daskcollect shared-memory name (``daskcollect-<pid>-<token>``), or ``None``."""
    pid = name[len(PREFIX) + 1 :].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def ours(name: str, own: set[int]) -> bool:
    """Whether this session made the shared-memory file ``name``: its creator is this process or one of
    its descendants, or is gone (a process of ours that died before it could be seen). Another suite's
    live processes' files on the same machine are not this session's."""
    pid = creator(name)
    return pid is None or pid in own or not psutil.pid_exists(pid)


def machine() -> Footprint:
    """Processes, the shared-memory files this session's processes made, and the threads of
    :func:`threads`, now."""
    shm = os.listdir(SHARED_MEMORY) if os.path.isdir(SHARED_MEMORY) else []
    processes = set(descendants())
    own = processes | {os.getpid()}
    return {
        "processes": processes,
        "shared-memory files": {f for f in shm if f.startswith(PREFIX) and ours(f, own)},
        "threads": threads(),
    }


def _worker_state(dask_worker) -> dict[str, list[str]]:
    return {
        "actors": [str(k) for k in dask_worker.state.actors if str(k).startswith(PREFIX)],
        "plugins": [name for name in dask_worker.plugins if name.startswith(PREFIX)],
        "handlers": [name for name in dask_worker.handlers if name.startswith(PREFIX)],
    }


def _scheduler_state(dask_scheduler) -> dict[str, list[str]]:
    plugins = [name for name in dask_scheduler.plugins if name.startswith(PREFIX)]
    return {"plugins": plugins, "tasks": [str(k) for k in dask_scheduler.tasks]}


#: What the scheduler logs for each of the leak check's own queries: dropped, not copied.
OWN_QUERY = "Run out-of-band function '_scheduler_state'"


async def _copy_lines(stream: asyncio.StreamReader) -> None:
    while line := await stream.readline():
        text = line.decode(errors="replace")
        if OWN_QUERY not in text:
            sys.stderr.write(text)


class SessionCluster:
    """The session's shared cluster, with a Client of the check's own that inspects it.

    Args:
        make: Starts a ``SubprocessCluster`` (its scheduler and nannies are processes of their own).
    """

    def __init__(self, make: Callable[[], SpecCluster]):
        before = threads()
        self.cluster = make()
        # Dask's SubprocessScheduler keeps its stderr as a pipe that nothing reads once it started:
        # full (64 KB of logs), it would block the scheduler. Its lines go to this session's stderr.
        stderr = self.cluster.scheduler.process.stderr
        asyncio.run_coroutine_threadsafe(_copy_lines(stderr), self.cluster.loop.asyncio_loop)
        self.client = Client(self.cluster, set_as_default=False)
        self.client.wait_for_workers(len(self.cluster.workers), timeout=60)
        #: Its event loops' threads and the check client's: they live as long as the session.
        self.threads = threads() - before

    def processes(self) -> set[int]:
        """Its scheduler, nannies and their children (the worker processes): they live as long as the session."""
        pids = {self.cluster.scheduler.process.pid}
        for worker in self.cluster.workers.values():
            pids.add(worker.process.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                pids |= {child.pid for child in psutil.Process(worker.process.pid).children()}
        return pids

    def footprint(self) -> Footprint:
        """What the test left on it: daskcollect's actors, worker plugins and handlers, scheduler plugins;
        any task."""
        try:
            workers = self.client.run(_worker_state, callback_timeout=ANSWER)
            scheduler = self.client.run_on_scheduler(_scheduler_state, callback_timeout=ANSWER)
        except Exception as exc:  # the test broke the shared cluster: that is a leak too
            return {"session cluster": {f"did not answer ({type(exc).__name__}: {exc})"}}
        return {
            "actors": {f"{a} on {w}" for w, s in workers.items() for a in s["actors"]},
            "worker plugins": {f"{p} on {w}" for w, s in workers.items() for p in s["plugins"]},
            "worker handlers": {f"{h} on {w}" for w, s in workers.items() for h in s["handlers"]},
            "scheduler plugins": set(scheduler["plugins"]),
            "scheduler tasks": set(scheduler["tasks"]),
        }

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def _runs(process: psutil.Process, module: str) -> bool:
    return f"from multiprocessing.{module} import main" in " ".join(process.cmdline())


def infrastructure(session: SessionCluster | None) -> set[int]:
    """Processes that outlive tests: the session's cluster, and ``multiprocessing``'s forkservers and
    resource trackers, which live as long as the process that started them (this one, a worker)."""
    pids = session.processes() if session is not None else set()
    for pid, process in descendants().items():
        with contextlib.suppress(psutil.NoSuchProcess):
            if _runs(process, "resource_tracker"):
                pids.add(pid)
            elif _runs(process, "forkserver") and not _runs(process.parent(), "forkserver"):
                pids.add(pid)  # a forkserver, not a process forked from one (same command line)
    return pids


def leftovers(before: Footprint, now: Callable[[], Footprint], allowed: Callable[[], set[int]]) -> Footprint:
    """What ``now()`` holds beyond ``before`` after a bounded wait (empty sets: nothing was left)."""
    extra: Footprint = {}

    def clean() -> bool:
        current = now()
        extra.clear()
        for kind, items in current.items():
            extra[kind] = items - before.get(kind, set())
        extra["processes"] = extra.get("processes", set()) - allowed()
        return not any(extra.values())

    wait_until(clean, timeout=GRACE, interval=0.1)
    return {kind: items for kind, items in extra.items() if items}


def kill(pids: set[int]) -> set[str]:
    """Kills ``pids``; what each was (or that it ended meanwhile), for the failure message."""
    named = set()
    for pid in pids:
        try:
            process = psutil.Process(pid)
            named.add(f"{pid}: {' '.join(process.cmdline())[:200]}")
            process.kill()
        except psutil.NoSuchProcess:
            named.add(f"{pid}: ended after the {GRACE:g} s grace")
    return named
