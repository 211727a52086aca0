"""daskcollect._dask: the Dask internals we use exist in the installed version, or a clear error says so."""

from __future__ import annotations

import warnings

import distributed
import pytest
from distributed.utils_test import gen_cluster

from daskcollect import DaskVersionError, _dask
from daskcollect.cluster import DriverNanny

#: What a private cluster's nannies drop (``daskcollect.cluster.DriverNanny``): they would measure
#: the driver's process and time its event loop again, as its scheduler does already.
MONITORS = {"monitor", "tick", "ticks", "shift_counters"}


class Held:
    """A stand-in actor."""


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_the_installed_distributed_is_in_the_tested_range_and_has_every_internal(c, s, a):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _dask.check_version()  # no warning within the tested range
    assert _dask.retire_handler(s) == s.retire_workers
    assert _dask.actor_keys(s, "tcp://127.0.0.1:1") == []
    actor = c.submit(Held, actor=True, key="held-0")
    await actor
    assert _dask.actor_keys(s, a.address) == ["held-0"]
    assert _dask.tick_callback(a) is a.periodic_callbacks["tick"]
    _dask.stop_loop(c)  # an asynchronous Client's loop is not its own: nothing to stop, nothing raised
    assert c.status == "running"


@gen_cluster(nthreads=[("127.0.0.1", 1)], Worker=distributed.Nanny)
async def test_dasks_nanny_runs_the_monitors_that_a_private_clusters_nanny_drops(s, a):
    assert set(a.periodic_callbacks) >= MONITORS  # a rename here would make DriverNanny drop nothing


@gen_cluster(nthreads=[("127.0.0.1", 1)], Worker=DriverNanny)
async def test_a_private_clusters_nanny_runs_none_of_them(s, a):
    assert not MONITORS & set(a.periodic_callbacks) and "monitor" in s.periodic_callbacks


class NotAScheduler:
    """Stands for a future Scheduler that dropped the internal."""


def test_a_missing_internal_is_a_typed_error_naming_it_and_the_fix():
    with pytest.raises(DaskVersionError) as info:
        _dask.retire_handler(NotAScheduler())
    message = str(info.value)
    assert "retire_workers" in message and distributed.__version__ in message
    assert f"distributed>={_dask.TESTED[0]},<{_dask.TESTED[1]}" in message
    assert info.value.internal.startswith("Scheduler.handlers")
    with pytest.raises(DaskVersionError, match="Worker.periodic_callbacks"):
        _dask.tick_callback(object())
    with pytest.raises(DaskVersionError, match="_loop_runner"):
        _dask.stop_loop(object())
