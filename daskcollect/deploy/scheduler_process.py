"""A private cluster's scheduler, in a child process of the driver.

``LocalCluster`` runs its scheduler in the driver's process, on the driver's
event loop. Answering each worker's heartbeat costs that loop about 0.65 ms of
CPU, and Dask has every worker send two a second up to 10 workers and one a
second up to 50: with the rest of the scheduler's work, 15 to 30 ms of CPU a
second at 8 to 32 workers, all of it under the GIL of the process that also
trains (docs/benchmarks.md, P7). :class:`SchedulerProcess`
is the ``SpecCluster`` scheduler spec that runs the same ``distributed.Scheduler``
in a child process instead; the nannies and everything else stay as they are.

The child is this module run with ``python -m``. It gets the driver's
``dask.config`` as Dask hands config to its child processes
(``dask.config.serialize`` in ``DASK_INTERNAL_INHERIT_CONFIG``), and the
scheduler's keywords (a ``Security`` among them) and ``sys.path`` through its stdin,
writes its address to a file, leaves Ctrl-C to the driver (which closes the
cluster), and closes itself within a second or two if the driver dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

import dask.config
from distributed import Scheduler
from distributed.deploy.spec import ProcessInterface

from daskcollect import _internals
from daskcollect.collection.polling import apoll_until
from daskcollect.errors import ClusterConnectionError, ConfigurationError

#: Seconds between the child's checks that the driver is still its parent.
PARENT_CHECK_INTERVAL = 1.0
#: Seconds a closing scheduler gets to exit before it is killed.
EXIT_GRACE = 5.0


class SchedulerProcess(ProcessInterface):
    """``distributed.Scheduler`` in a child process, as a ``SpecCluster`` scheduler.

    Args:
        timeout: Seconds to wait for the scheduler's address.
        **kwargs: ``distributed.Scheduler``'s keywords (``LocalCluster``'s
            scheduler options). They and ``sys.path`` must pickle, and the
            current ``dask.config`` must be JSON, as Dask requires of config
            it hands to a child process.

    Raises:
        ConfigurationError: If the current ``dask.config`` is not JSON.
    """

    def __init__(self, timeout: float = 30.0, **kwargs: Any):
        self.timeout = timeout
        self.kwargs = kwargs
        # Taken now: the cluster is built inside the caller's dask.config.set.
        self.config = _serialized_config(dask.config.config)
        self.process: subprocess.Popen | None = None
        self._folder: str | None = None
        super().__init__()

    async def start(self) -> None:
        """Starts the child and waits (bounded) for its address.

        Raises:
            ClusterConnectionError: If the child exits or stays silent past
                ``timeout``; its own error, if any, is on this process's stderr.
        """
        self._folder = tempfile.mkdtemp(prefix="daskcollect-scheduler-")
        path = os.path.join(self._folder, "scheduler.json")
        payload = {
            "kwargs": {**self.kwargs, "scheduler_file": path},
            "sys_path": list(sys.path),
            "parent": os.getpid(),
        }
        env = {**os.environ, "DASK_INTERNAL_INHERIT_CONFIG": self.config}
        self.process = process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, env=env
        )
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(pickle.dumps(payload))
        identity = await apoll_until(
            lambda: _read_identity(path) or process.poll() is not None, self.timeout, interval=0.02
        )
        if not isinstance(identity, dict):  # the child exited, or the time is up
            code = process.poll()
            await self.close()
            raise ClusterConnectionError(_start_failure(code, self.timeout))
        self.address = identity["address"]
        await super().start()

    async def close(self) -> None:
        """Waits for the child to exit (``SpecCluster`` has asked the scheduler to close), then kills it."""
        process, self.process = self.process, None
        if process is not None:
            await _stop(process, grace=EXIT_GRACE if self.address else 0.0)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        await super().close()


def _serialized_config(config: dict) -> str:
    """``config`` as Dask hands config to a child process (:func:`dask.config.serialize`)."""
    try:
        return dask.config.serialize(config)
    except (TypeError, ValueError):
        bad = []
        for key, value in config.items():
            try:
                dask.config.serialize(value)
            except (TypeError, ValueError):
                bad.append(key)
        raise ConfigurationError(
            f"The private cluster's scheduler process gets dask.config as Dask hands config to child "
            f"processes, as JSON, and these sections are not JSON: {bad}. Set them to plain values, or "
            "set daskcollect.local-cluster.scheduler-process to false to run the scheduler in this process."
        ) from None


def _read_identity(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet, or half written
        return None


def _start_failure(code: int | None, timeout: float) -> str:
    if code is None:
        return (
            f"The private cluster's scheduler process did not start within {timeout:g}s. The machine "
            "may be overloaded: raise daskcollect.timeouts.connect, or set "
            "daskcollect.local-cluster.scheduler-process to false to run it in this process."
        )
    return (
        f"The private cluster's scheduler process exited with code {code} before it started; its "
        "error is printed above. Fix it, or set daskcollect.local-cluster.scheduler-process to "
        "false to run the scheduler in this process."
    )


async def _stop(process: subprocess.Popen, grace: float) -> None:
    """Waits up to ``grace`` seconds for ``process`` to exit, then terminates it, then kills it."""
    for action, wait in ((None, grace), (process.terminate, 2.0), (process.kill, 5.0)):
        if action is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                action()
        if await apoll_until(lambda: process.poll() is not None, wait, interval=0.02):
            return


async def _serve(kwargs: dict, parent: int) -> None:
    async with Scheduler(**kwargs) as scheduler:
        finished = asyncio.ensure_future(scheduler.finished())
        while not finished.done():
            if os.getppid() != parent:  # the driver died without closing us
                await scheduler.close()
            await asyncio.wait({finished}, timeout=PARENT_CHECK_INTERVAL)


def _main() -> None:
    payload = pickle.load(sys.stdin.buffer)
    if os.getppid() != payload["parent"]:
        return
    # Ctrl-C reaches the whole process group: the driver handles it and closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = payload["sys_path"]
    # As quiet as LocalCluster keeps an in-process scheduler (its silence_logs).
    logging.getLogger("distributed").setLevel(logging.WARNING)
    _internals.run_loop(_serve(payload["kwargs"], payload["parent"]))  # uvloop where Dask's config says so


if __name__ == "__main__":
    _main()
