"""Resuming a killed driver: re-attaching to its running collectors against building them again.

    python benchmarks/reattach.py --build-seconds 3 --pairs 3

A cluster of 2 worker processes runs here; the drivers are ``tests/resumable_driver.py`` in processes
of their own, on an env whose construction takes ``--build-seconds`` (as one that loads assets or
starts processes would). Each pair, interleaved: a driver is killed with SIGKILL after 5 batches and
started again on its checkpoint, once with ``daskcollect.reattach.grace-period`` set (the new driver
takes the collectors over) and once without (it builds them again). The figure is the resumed
driver's time from building its ``DaskCollector`` to its first batch, and the envs built meanwhile.
Results go to benchmarks/results/reattach.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from _common import TESTS, header, save
from distributed import Client, LocalCluster

DRIVER = os.path.join(TESTS, "resumable_driver.py")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--build-seconds", type=float, default=3.0, help="how long each env takes to build")
parser.add_argument("--pairs", type=int, default=3)
parser.add_argument("--timeout", type=float, default=300, help="seconds per driver")
parser.add_argument("--out", default=None)


def driver(address: str, folder: str, reattach: bool) -> subprocess.Popen:
    env = dict(os.environ)
    if reattach:
        env["DASK_DASKCOLLECT__REATTACH__GRACE_PERIOD"] = "120s"
    return subprocess.Popen([sys.executable, DRIVER, address, folder, "sync", "restore", "reattach"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the driver did not get there in time")
        time.sleep(0.1)


def actors(dask_worker) -> int:
    return len(dask_worker.state.actors)


def built(client: Client) -> int:
    from makers import envs_built

    return sum(client.run(envs_built, callback_timeout=30).values())


def one(client: Client, reattach: bool, timeout: float) -> dict:
    address = client.scheduler.address
    with tempfile.TemporaryDirectory() as folder:
        first = driver(address, folder, reattach)
        try:
            wait_for(lambda: len([n for n in os.listdir(folder) if n.startswith("batch-")]) >= 5, timeout)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        if not reattach:  # the killed driver's actors go with its client
            wait_for(lambda: not sum(client.run(actors, callback_timeout=30).values()), 60)
        before = built(client)
        second = driver(address, folder, reattach)
        if second.wait(timeout=timeout) != 0:
            raise RuntimeError("the resumed driver failed")
        seconds = float(open(os.path.join(folder, "resumed_in.txt")).read())
        return {"reattach": reattach, "resume_s": seconds, "envs_built": built(client) - before}


def main() -> None:
    args = parser.parse_args()
    os.environ["DASKCOLLECT_TEST_ENV_BUILD_SECONDS"] = str(args.build_seconds)  # the workers inherit it
    result = header("reattach", args)
    runs = []
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster:
        with Client(cluster) as client:
            for pair in range(args.pairs):
                for reattach in (pair % 2 == 0, pair % 2 == 1):  # interleaved, alternating first
                    runs.append(one(client, reattach, args.timeout))
                    print(runs[-1], flush=True)
    for name, flag in (("reattach", True), ("rebuild", False)):
        mine = [r for r in runs if r["reattach"] is flag]
        result[name] = {
            "resume_s_median": statistics.median(r["resume_s"] for r in mine),
            "envs_built": [r["envs_built"] for r in mine],
        }
    result["runs"] = runs
    print(f"resume to first batch: re-attach {result['reattach']['resume_s_median']:.2f} s, "
          f"rebuild {result['rebuild']['resume_s_median']:.2f} s")  # fmt: skip
    print("saved", save(result, "reattach", args.out))


if __name__ == "__main__":
    main()
