"""Screenshots of the /daskcollect page during a run of the PPO example (docs/img/dashboard-ppo.png).

    python tools/dashboard_screenshot.py [--seconds 150] [--out docs/img/dashboard-ppo.png]

Runs ``examples/ppo_cartpole.py`` (DaskCollector, 2 collectors, its private
LocalCluster) with the dashboard on a fixed loopback port, waits, and has
headless Chromium (Debian's ``chromium``) save the page. Bounded: the example
is stopped once the screenshot is taken or after ``--seconds`` plus a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 8799
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]  # fmt: skip

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--seconds", type=float, default=150, help="how long the example runs before the screenshot"
)
parser.add_argument("--out", default=str(ROOT / "docs" / "img" / "dashboard-ppo.png"))
parser.add_argument("--size", default="1100,1250", help="Chromium's window size")


def page_json(base: str) -> dict:
    try:
        return json.loads(urllib.request.urlopen(base + "/json", timeout=5).read())
    except OSError:
        return {}


def main(args) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("Debian's chromium is needed (apt-get install chromium)")
    env = {**os.environ, "DASK_DASKCOLLECT__LOCAL_CLUSTER__DASHBOARD_ADDRESS": f"127.0.0.1:{PORT}"}
    example = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "ppo_cartpole.py"), "--frames", "1000000", "--target", "1e9"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{PORT}/daskcollect"
    try:
        deadline = time.monotonic() + args.seconds + 60
        started = None
        while time.monotonic() < deadline and example.poll() is None:
            if started is None and page_json(base):
                started = time.monotonic()  # the collection reported: the run is under way
            if started is not None and time.monotonic() - started >= args.seconds:
                break
            time.sleep(1)
        if started is None:
            sys.exit("the example never reported to the dashboard")
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={args.size}",
                 f"--screenshot={args.out}", base],
                check=True, capture_output=True, timeout=90,
            )  # fmt: skip
        print(f"saved {args.out} after {time.monotonic() - started:.0f} s of collection")
    finally:
        example.terminate()
        try:
            example.wait(timeout=60)
        except subprocess.TimeoutExpired:
            example.kill()


if __name__ == "__main__":
    main(parser.parse_args())
