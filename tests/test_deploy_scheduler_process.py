"""A private cluster's scheduler, in a child process of the driver."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import dask
import psutil
import pytest
from helpers import SHARED_MEMORY, wait_until
from makers import make_cartpole

from daskcollect import ClusterConnectionError, ConfigurationError, DaskCollector
from daskcollect.weights.shm import remove_stale

# Defined outside any importable module, so that it travels by value: the scheduler
# must not import this test module (and torch with it) to run it.
PROBE = """
def on_scheduler(dask_scheduler):
    import os, sys, time, dask
    samples = dask_scheduler.monitor.quantities["time"]
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "torch": "torch" in sys.modules,
        "stealing": dask.config.get("distributed.scheduler.work-stealing"),
        "monitor age": time.time() - samples[-1] if samples else None,
    }
"""
_namespace: dict = {"__name__": "daskcollect_test_probe"}
exec(PROBE, _namespace)
on_scheduler = _namespace["on_scheduler"]


def scheduler_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if "daskcollect.deploy.scheduler_process" in p.cmdline()]


def test_a_private_cluster_runs_its_scheduler_in_a_child_process_that_never_loads_torch():
    with DaskCollector(make_cartpole, frames_per_batch=20, total_frames=100, num_collectors=2) as collector:
        assert sum(b.numel() for b in collector) == 100
        seen = collector.client.run_on_scheduler(on_scheduler)
        link = collector.client.dashboard_link.replace("/status", "/daskcollect")
        page = urllib.request.urlopen(link, timeout=30).read().decode()
    assert seen["ppid"] == os.getpid() != seen["pid"]
    assert seen["torch"] is False  # daskcollect's plugins and actor tasks unpickle without it
    assert seen["stealing"] is False  # the private cluster's Dask settings reached it
    assert seen["monitor age"] < 10  # the scheduler still monitors its own process
    assert "collector" in page.lower()  # the page plugin serves from the child's dashboard
    assert wait_until(lambda: not psutil.pid_exists(seen["pid"]), timeout=10)


def test_a_config_dask_cannot_hand_to_a_child_is_a_clear_error_and_leaves_no_process():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with dask.config.set({"users-section": {"a-callable": print}}):
        with pytest.raises(ConfigurationError, match=r"not JSON: \['users-section'\].*scheduler-process"):
            DaskCollector(make_cartpole, frames_per_batch=20, total_frames=100, num_collectors=1)
    assert wait_until(
        lambda: {p.pid for p in psutil.Process().children(recursive=True)} <= before, timeout=10
    )


def test_with_the_setting_off_the_scheduler_runs_in_the_driver():
    with dask.config.set({"daskcollect.local-cluster.scheduler-process": False}):
        with DaskCollector(
            make_cartpole, frames_per_batch=20, total_frames=40, num_collectors=1
        ) as collector:
            assert sum(b.numel() for b in collector) == 40
            assert collector.client.run_on_scheduler(os.getpid) == os.getpid()


def test_a_scheduler_that_cannot_start_is_a_clear_error_and_leaves_no_process():
    before = {p.pid for p in scheduler_children()}
    start = time.monotonic()
    # 192.0.2.1 (TEST-NET-1) is on no interface: the child's scheduler cannot bind it.
    with dask.config.set({"daskcollect.local-cluster.host": "192.0.2.1"}):
        with pytest.raises(ClusterConnectionError, match="exited with code 1 before it started"):
            DaskCollector(make_cartpole, frames_per_batch=20, total_frames=40, num_collectors=1)
    assert time.monotonic() - start < 30
    assert {p.pid for p in scheduler_children()} <= before


@pytest.mark.timeout(240)
def test_the_scheduler_process_goes_when_the_driver_is_killed(tmp_path):
    """A driver killed with SIGKILL cannot close its cluster: the scheduler notices and exits."""
    pid_file = tmp_path / "scheduler.pid"
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os
            from daskcollect import DaskCollector
            from makers import make_cartpole

            if __name__ == "__main__":
                collector = DaskCollector(make_cartpole, frames_per_batch=20, total_frames=-1, num_collectors=1)
                pid = collector.client.run_on_scheduler(os.getpid)
                with open({str(pid_file)!r} + ".tmp", "w") as f:
                    f.write(str(pid))
                os.rename({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
                for i, _ in enumerate(collector):
                    assert i < 1_000_000
            """
        )
    )
    # A shared-memory folder of the test's own: a driver of another test (a second xdist worker) would
    # remove the killed driver's folder from /dev/shm as stale before this test looks at it.
    shm = os.path.join(SHARED_MEMORY, f"daskcollect-test-{os.getpid()}-{tmp_path.name}")
    os.makedirs(shm)
    env = {**os.environ, "DASK_DASKCOLLECT__WEIGHTS__SHARED_MEMORY_DIR": shm}
    driver = subprocess.Popen(
        [sys.executable, str(script)], stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    try:
        assert wait_until(pid_file.exists, timeout=120), driver.poll()
        scheduler = int(pid_file.read_text())
        assert psutil.Process(scheduler).ppid() == driver.pid
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        assert wait_until(lambda: not psutil.pid_exists(scheduler), timeout=15)
        # Its shared-memory folder stays until the next driver starts, which removes it.
        left = [f for f in os.listdir(shm) if f.startswith(f"daskcollect-{driver.pid}-")]
        assert len(left) == 1
        remove_stale(shm)
        assert not os.path.exists(os.path.join(shm, left[0]))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
