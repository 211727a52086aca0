"""daskcollect._dask: the Dask internals we use exist in the installed version, or a clear error says so."""

from __future__ import annotations

import distributed
import pytest

from daskcollect import DaskVersionError, _dask


def test_the_installed_distributed_is_in_the_tested_range_and_has_every_internal(cluster):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _dask.check_version()  # no warning within the tested range
    scheduler = cluster.scheduler
    assert callable(_dask.retire_handler(scheduler))
    assert _dask.actor_keys(scheduler, "tcp://127.0.0.1:1") == []
    for address in scheduler.workers:
        assert isinstance(_dask.actor_keys(scheduler, address), list)


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
