"""The WorkerPlugin: worker_env applied before envs are built, with no restart."""

from __future__ import annotations

import asyncio
import logging
import os

import torch
from distributed import LocalCluster
from makers import make_cartpole, make_env_reading_variable

from daskcollect import DaskCollector, _internals
from daskcollect._internals import HEARTBEAT_FAILURE, QuietHeartbeatAtClose
from daskcollect.settings import WorkerSettings
from daskcollect.worker.plugin import WorkerSetup


def read_env(name):
    import os

    return os.environ.get(name)


def test_worker_env_visible_in_env_constructor_without_restart(client):
    pids = client.run(os.getpid)
    assert client.run(read_env, "DASKCOLLECT_TEST_VAR") == dict.fromkeys(pids)
    with DaskCollector(
        make_env_reading_variable,  # raises unless the variable is set on the worker
        frames_per_batch=20,
        total_frames=40,
        worker_env={"DASKCOLLECT_TEST_VAR": "set-by-plugin"},
        client=client,
    ) as collector:
        assert len(list(collector)) == 2
        assert set(client.run(read_env, "DASKCOLLECT_TEST_VAR").values()) == {"set-by-plugin"}
        assert client.run(os.getpid) == pids  # same processes: no restart
    # Removing the plugin at shutdown restores the workers' environment.
    assert client.run(read_env, "DASKCOLLECT_TEST_VAR") == dict.fromkeys(pids)
    assert client.run(os.getpid) == pids


def test_plugin_setup_and_teardown_in_process():
    name = "DASKCOLLECT_PLUGIN_UNIT"
    os.environ[name] = "before"
    threads = torch.get_num_threads()
    plugin = WorkerSetup({name: "during"}, WorkerSettings(torch_threads=None))
    asyncio.run(plugin.setup(worker=None))
    assert os.environ[name] == "during"
    assert torch.get_num_threads() == threads
    plugin.teardown(worker=None)
    assert os.environ[name] == "before"
    del os.environ[name]


def test_foreign_scratch_dirs_are_trimmed_and_restored(client):
    from daskcollect.worker.plugin import foreign_scratch_dirs

    paths = [
        "/x/dask-scratch-space/worker-a",
        "/x/dask-scratch-space",
        "/x/dask-scratch-space/scheduler-b",
        "/lib",
    ]
    assert foreign_scratch_dirs(paths, own="/x/dask-scratch-space/worker-a") == paths[1:3]

    def scratch_entries():
        import os
        import sys

        def scratch(path: str) -> bool:  # the scratch root or a node's folder in it
            return "dask-scratch-space" in (os.path.basename(path), os.path.basename(os.path.dirname(path)))

        return sorted(p for p in sys.path if scratch(p))

    before = client.run(scratch_entries)
    assert any(len(entries) > 1 for entries in before.values())  # the inherited junk is there
    with DaskCollector(make_cartpole, frames_per_batch=10, total_frames=20, client=client) as c:
        during = client.run(scratch_entries)
        assert len(list(c)) == 2
    for address, entries in during.items():
        own = client.run(lambda dask_worker: dask_worker.local_directory, workers=[address])[address]
        assert all(p == own for p in entries)  # only the worker's own directory is left
    assert client.run(scratch_entries) == before  # restored at shutdown


def test_tick_interval_relaxed_while_registered_and_restored(client):
    def tick_ms(dask_worker):  # read through daskcollect's one accessor of it (tests/test_dask_internals.py)
        return _internals.tick_callback(dask_worker).callback_time

    before = client.run(tick_ms)
    with DaskCollector(make_cartpole, frames_per_batch=10, total_frames=20, client=client):
        assert set(client.run(tick_ms).values()) == {1000}
    assert client.run(tick_ms) == before


def quiet_filters() -> int:
    import logging

    from daskcollect._internals import QuietHeartbeatAtClose

    return sum(isinstance(f, QuietHeartbeatAtClose) for f in logging.getLogger("distributed.worker").filters)


def test_a_heartbeat_cut_by_the_workers_own_close_is_not_logged_as_an_error(client):
    """Worker.close closes its connections under a heartbeat still waiting for the scheduler;
    Dask logs that as an error with a traceback. Only then is it dropped."""
    failure = f"{HEARTBEAT_FAILURE}."
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        worker = next(iter(cluster.workers.values()))
        quiet = QuietHeartbeatAtClose(worker)
        assert quiet.filter(log_record(failure))  # a running worker's failed heartbeat is an error
    assert not quiet.filter(log_record(failure))  # a closed worker's is not
    assert quiet.filter(log_record("Unexpected exception during heartbeat. Closing worker."))

    before = client.run(quiet_filters)
    with DaskCollector(make_cartpole, frames_per_batch=10, total_frames=20, client=client):
        assert all(n == before[a] + 1 for a, n in client.run(quiet_filters).items())
    assert client.run(quiet_filters) == before  # a live worker gets its logging back at removal


def log_record(message: str) -> logging.LogRecord:
    return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message, None, None)
