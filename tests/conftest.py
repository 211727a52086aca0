"""Shared fixtures: real loopback clusters with worker processes, and a leak check after every test.

- ``cluster``: one 2-worker cluster for the whole session, for every test that
  only needs a working cluster (``client`` is a user's ``Client`` on it). It is
  Dask's ``SubprocessCluster``: scheduler and nannies in processes of their own,
  workers started with Dask's default method (``spawn``), as on a cluster started
  by hand. Tests that kill, retire or restart workers build their own with
  ``make_cluster``; plugin, membership and retirement logic runs in process on
  Dask's ``gen_cluster``.
- The leak check (``_no_leaks``, autouse) fails a test that left daskcollect
  actors, plugins or any task on the session's cluster, or files in
  ``/dev/shm``, daskcollect or Dask event-loop threads, or processes on this
  machine (``tests/leaks.py``). ``_own_config`` ends each test's config changes
  with it.
- The workers of clusters started in this process (``make_cluster``, private
  clusters) fork from one ``multiprocessing`` forkserver that has imported the
  collector stack (torch, tensordict, TorchRL, daskcollect's actor), as Dask's
  own suite does (``distributed.utils.get_mp_context``): a spawned worker imports
  them again, 3.5 s of CPU each. A worker preload gives their own sub-processes
  ``spawn`` again (``tests/worker_preload.py``). The session's cluster, and every
  script run in a fresh interpreter (the docs, the examples, the command line,
  the main-guard and scheduler-process tests), start workers as users' do.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import multiprocessing.forkserver
import os
import warnings

import dask
import psutil
import pytest
from distributed import Client, LocalCluster
from distributed.deploy.subprocess import SubprocessCluster
from helpers import children, environment
from leaks import SessionCluster, infrastructure, kill, leftovers, machine

import daskcollect  # noqa: F401  (registers the daskcollect config defaults)
from daskcollect import _internals

# Bounded waits, shorter than pytest-timeout's, so a hang fails with our error.
TEST_TIMEOUTS = {
    "daskcollect.timeouts.connect": "5s",
    "daskcollect.timeouts.workers": "20s",
    "daskcollect.timeouts.actor-start": "60s",
    "daskcollect.timeouts.rollout": "60s",
    "daskcollect.timeouts.call": "30s",
    "daskcollect.timeouts.shutdown": "20s",
}

#: What the forkserver imports once, so that the workers forked from it start in a fraction of a second.
PRELOAD = ["distributed", "gymnasium", "daskcollect.worker.actor"]
TESTS = os.path.dirname(os.path.abspath(__file__))
#: Run by every worker as it starts: its own sub-processes start with ``spawn`` again.
WORKER_PRELOAD = os.path.join(TESTS, "worker_preload.py")
#: Run by the session cluster's scheduler and nannies: they die with this process.
GUARD = os.path.join(TESTS, "session_guard.py")
# The suite's helpers and makers (pickled by reference) import in every process started from here,
# as installed code would on a real cluster: workers, `dask worker` commands, simulated hosts.
if TESTS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)

_session: SessionCluster | None = None


@pytest.fixture(scope="session", autouse=True)
def _forkserver():
    """Starts the forkserver (inside the session's output capture, so that the workers' logs are
    captured with the test that caused them) and makes every cluster of this process use it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
    forked = {
        "distributed.worker.multiprocessing-method": "forkserver",
        "distributed.worker.preload": [WORKER_PRELOAD],
    }
    with dask.config.set(forked):
        yield


@pytest.fixture(autouse=True)
def _own_config():
    """Each test's config changes end with it. Dask's ``gen_cluster`` replaces the whole config with
    the one ``distributed.utils_test`` saw when imported, and leaves it so: dask-jobqueue's defaults
    and this session's settings would be gone for every later test."""
    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


@pytest.fixture(autouse=True)
def _bounded_timeouts(_own_config):
    with dask.config.set(TEST_TIMEOUTS), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def _footprint() -> dict[str, set]:
    if _session is None:
        return machine()
    here = machine()
    here["threads"] -= _session.threads
    return {**here, **_session.footprint()}


@pytest.fixture(autouse=True)
def _no_leaks(_forkserver):
    """Fails the test if it left daskcollect's state on the session's cluster or on this machine."""
    before = _footprint()
    yield
    left = leftovers(before, _footprint, lambda: infrastructure(_session))
    if left:
        if "processes" in left:
            left["processes (killed now)"] = kill(left.pop("processes"))
        pytest.fail(f"the test left behind: {left}", pytrace=False)


def _local_cluster(daemon: bool = False, **kwargs) -> LocalCluster:
    kwargs.setdefault("n_workers", 2)
    kwargs.setdefault("processes", True)
    if not kwargs["processes"]:
        kwargs.setdefault("protocol", "tcp://")  # in-process workers, still on TCP
    # Non-daemonic workers may start sub-processes (ParallelEnv, MultiSyncCollector).
    with dask.config.set({"distributed.worker.daemon": daemon}):
        return LocalCluster(threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0", **kwargs)


@pytest.fixture(scope="session")
def cluster(_forkserver):
    """The session's 2-worker loopback cluster (started by the first test that asks for it).

    Dask's ``SubprocessCluster``: its scheduler and nannies run in processes of their own, as on a
    cluster started by hand, and its workers start with Dask's default method. None of them is a
    ``multiprocessing`` child of this process, which Dask's ``gen_cluster`` terminates.
    """
    global _session
    # Non-daemonic workers may start sub-processes (ParallelEnv, MultiSyncCollector).
    inherited = dask.config.serialize(
        {"distributed": {"worker": {"daemon": False}}, "logging": {"distributed.scheduler": "warning"}}
    )
    with environment(DASK_INTERNAL_INHERIT_CONFIG=inherited):
        _session = SessionCluster(
            lambda: SubprocessCluster(
                n_workers=2,
                threads_per_worker=1,
                dashboard_address="127.0.0.1:0",
                scheduler_kwargs={"preload": [GUARD]},
                worker_kwargs={"preload_nanny": [GUARD]},
            )
        )
    yield _session.cluster
    _session.close()
    _session = None


@pytest.fixture(scope="module")
def tls_cluster():
    """A 2-worker LocalCluster on tls:// (Security.temporary(): a throwaway CA and certificate)."""
    with _local_cluster(security=True) as c:
        yield c


@pytest.fixture
def client(cluster):
    """A user's Client on the session's cluster (never closed by daskcollect)."""
    with Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=30)
        yield c


@pytest.fixture
def make_cluster():
    """Builds LocalClusters of a test's own (for kills, retirements, restarts) and closes them afterwards."""
    made = []
    before = children()

    def make(**kwargs):
        made.append(_local_cluster(**kwargs))
        return made[-1]

    yield make
    for c in made:
        # A test may have closed its scheduler: its workers are then killed below, not waited for.
        running = c.scheduler is not None and c.scheduler.status.name == "running"
        with contextlib.suppress(Exception):
            c.close(timeout=10 if running else 1)
        _internals.stop_loop(c)  # a close that timed out raised before stopping the cluster's event loop
    for pid in children() - before:  # whatever a broken cluster left behind
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
