"""Helpers that tests import by name (`from helpers import ...`; `conftest` is two modules here, and the root one imports `tests.helpers`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import dask
import psutil
import pytest
from distributed import Client

import daskcollect  # noqa: F401  (registers the daskcollect config defaults read below)

#: The folder of the driver's shared-memory weights (daskcollect's setting, /dev/shm by default).
SHARED_MEMORY = dask.config.get("daskcollect.weights.shared-memory-dir")
#: An address where no scheduler listens: a check made before connecting fails first, and one made
#: after fails with ClusterConnectionError instead (validation tests need no cluster).
NO_SCHEDULER = "tcp://127.0.0.1:1"


def children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


def fresh_python(code: str, timeout: float = 60.0) -> str:
    """Runs ``code`` in a new interpreter (imports start from nothing); its stripped stdout.

    Fails the test, showing the interpreter's stderr, if it exits non-zero.
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


@contextlib.contextmanager
def environment(**variables: str):
    """Sets environment variables for the block (what processes started in it inherit)."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def streams_served(dask_worker) -> dict[str, str]:
    """The completion streams a worker serves, actor key -> comm address (``client.run(streams_served)``)."""
    from daskcollect.streams import worker as stream

    return dict(stream.serving)


def collectors_idle(collector) -> bool:
    """No rollout runs on any of the collection's collectors (``stats()``'s states)."""
    states = [c["state"] for c in collector.stats()["collectors"]]
    return states == ["idle"] * len(states)


#: What tools/slurm.sh and tests/test_slurm.py need.
SLURM_COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel")


def slurm_unavailable() -> str | None:
    """Why tests/test_slurm.py cannot run its SLURM here, or ``None`` where it can."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])
    missing = [name for name in SLURM_COMMANDS if shutil.which(name, path=path) is None]
    if missing:
        return (f"SLURM is not installed here ({', '.join(missing)} missing): "
                "apt-get install slurmctld slurmd slurm-client munge, as .ci/run does")  # fmt: skip
    if os.geteuid() != 0:
        return "tools/slurm.sh runs SLURM's daemons as root, without systemd; this is not root"
    return None


def add_worker_with(cluster, client, resources: dict[str, float]) -> str:
    """Adds one worker that declares ``resources`` to a LocalCluster; its address once it joined."""
    n = len(cluster.worker_spec)
    cluster.worker_spec[n] = {
        "cls": cluster.worker_spec[0]["cls"],
        "options": {**cluster.worker_spec[0]["options"], "resources": resources},
    }
    cluster.scale(n + 1)
    client.wait_for_workers(n + 1, timeout=30)
    workers = client.scheduler_info(n_workers=-1)["workers"]
    (address,) = [a for a, w in workers.items() if w.get("resources", {}) == resources]
    return address


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.1) -> bool:
    """Polls ``predicate`` until it is true or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def changes_left(client: Client, before: dict, timeout: float) -> list[str]:
    """What still differs from ``before`` (a ``testing.cluster_state``) after waiting up to ``timeout``."""
    from daskcollect.testing import cluster_state, differences

    wait_until(lambda: differences(before, cluster_state(client)) == [], timeout=timeout)
    return differences(before, cluster_state(client))


def actors_on(client: Client) -> dict[str, list[str]]:
    """The actor keys held by each worker."""
    return client.run(lambda dask_worker: [str(k) for k in dask_worker.state.actors])


def collector_keywords(**overrides) -> dict:
    """Every keyword of ``DaskCollector`` at its default, for building a spec without a cluster."""
    import inspect

    from makers import make_cartpole

    from daskcollect import DaskCollector

    params = inspect.signature(DaskCollector.__init__).parameters
    kw = {n: p.default for n, p in params.items() if n not in ("self", "ray_only")}
    kw.update(create_env_fn=make_cartpole, policy=None, frames_per_batch=100, ray_only={})
    kw.update(overrides)
    return kw


def noise(stderr: str) -> list[str]:
    """What a clean run must not print: Python warnings, and tracebacks not logged by Dask itself.

    Dask logs some races of its own shutdown with a traceback (a worker whose
    heartbeat meets a closing scheduler on an overloaded machine); those follow a
    ``distributed.* - ERROR -`` log line, with the tracebacks chained to it, and
    are not the program's.
    """
    lines = stderr.splitlines()
    out = [line for line in lines if re.search(r"\w+Warning: ", line)]
    previous, dasks = "", False  # the last line that is not blank; whether the chain read is Dask's
    for line in lines:
        if line.startswith("Traceback") and not previous.startswith(CHAINED):
            dasks = re.search(r" - distributed\.\S+ - \w+ - ", previous) is not None  # a chain starts
        if line.startswith("Traceback") and not dasks:
            out.append(line)
        previous = line if line.strip() else previous
    return out


#: The lines with which Python joins the tracebacks of a chain of exceptions.
CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


CHROMIUM = shutil.which("chromium")
# Flags for a closed network (see .ci/run): no background connections, no sandbox as root.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]  # fmt: skip


def chromium(tmp_path, *args: str, attempts: int = 3) -> str:
    """Runs headless Chromium (fresh profile per attempt) until it prints a page; returns stdout.

    A loaded 2-core machine can make Chromium give up before the page loads; each
    attempt is bounded, and a failure shows what Chromium said.
    """
    runs = []
    for attempt in range(attempts):
        profile = tmp_path / f"chromium-profile-{uuid.uuid4().hex[:8]}"
        run = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=90,
        )
        runs.append(run)
        if run.returncode == 0 and ("--dump-dom" not in args or "</html>" in run.stdout):
            return run.stdout
        time.sleep(1 + attempt)
    tails = "\n---\n".join(
        f"rc={r.returncode} stdout ({len(r.stdout)} chars): {r.stdout[:300]!r} stderr: {r.stderr[-1500:]}"
        for r in runs
    )
    pytest.fail(f"chromium {' '.join(args)} gave no page in {attempts} attempts:\n{tails}")


def dashboard_base(cluster) -> str:
    return cluster.dashboard_link.rsplit("/", 1)[0]


def _run_forked(target: str, args: tuple, env: dict[str, str]) -> None:
    """In a process forked from the suite's forkserver: ``module:function(*args)`` with ``env`` set and
    read again by ``dask.config``, as a new interpreter started with that environment would."""
    import importlib

    os.environ.update(env)
    dask.config.refresh()
    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(*args)


class Forked:
    """A script's ``main`` run in a process forked from the suite's forkserver, which has imported the
    collector stack: the process starts in a fraction of a second where a new interpreter takes
    seconds. ``send_signal`` and ``wait`` as ``subprocess.Popen``'s.

    Args:
        target: ``"module:function"``, importable from ``tests/``.
        args: Its arguments.
        env: Environment variables it runs with.
    """

    def __init__(self, target: str, *args: str, env: dict[str, str] | None = None):
        import multiprocessing

        context = multiprocessing.get_context("forkserver")
        self.process = context.Process(target=_run_forked, args=(target, args, env or {}), daemon=False)
        self.process.start()
        self.pid = self.process.pid

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """Waits (bounded) for the process to end; its exit code (``-N`` for a signal), as ``Popen.wait``.

        Raises:
            subprocess.TimeoutExpired: If it is still running after ``timeout`` seconds.
        """
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout)
        return self.process.exitcode
