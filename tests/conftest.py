"""Shared fixtures: real loopback LocalClusters with worker processes."""

from __future__ import annotations

import contextlib
import warnings

import dask
import psutil
import pytest
from distributed import Client, LocalCluster
from helpers import children

import daskcollect  # noqa: F401  (registers the daskcollect config defaults)

# Bounded waits, shorter than pytest-timeout's, so a hang fails with our error.
TEST_TIMEOUTS = {
    "daskcollect.timeouts.connect": "5s",
    "daskcollect.timeouts.workers": "20s",
    "daskcollect.timeouts.actor-start": "60s",
    "daskcollect.timeouts.rollout": "60s",
    "daskcollect.timeouts.call": "30s",
    "daskcollect.timeouts.shutdown": "20s",
}


@pytest.fixture(autouse=True)
def _bounded_timeouts():
    with dask.config.set(TEST_TIMEOUTS), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def _local_cluster(daemon: bool = False, **kwargs) -> LocalCluster:
    kwargs.setdefault("n_workers", 2)
    # Non-daemonic workers may start sub-processes (ParallelEnv, MultiSyncCollector).
    with dask.config.set({"distributed.worker.daemon": daemon}):
        return LocalCluster(
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            **kwargs,
        )


@pytest.fixture(scope="module")
def cluster():
    """A 2-worker loopback LocalCluster shared by a test module."""
    with _local_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def tls_cluster():
    """A 2-worker LocalCluster on tls:// (Security.temporary(): a throwaway CA and certificate)."""
    with _local_cluster(security=True) as c:
        yield c


@pytest.fixture
def client(cluster):
    """A user's Client on the shared cluster (never closed by daskcollect)."""
    with Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=30)
        yield c


@pytest.fixture
def make_cluster():
    """Builds extra LocalClusters for one test and closes them afterwards."""
    made = []
    before = children()

    def make(**kwargs):
        made.append(_local_cluster(**kwargs))
        return made[-1]

    yield make
    for c in made:
        with contextlib.suppress(Exception):  # a test may have killed its scheduler
            c.close(timeout=10)
    for pid in children() - before:  # whatever a broken cluster left behind
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
