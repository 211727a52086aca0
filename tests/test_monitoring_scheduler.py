"""The collectors on the Dask dashboard: the /daskcollect page in a real headless Chromium, /metrics."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request

import pytest
from distributed import Client, performance_report
from helpers import CHROMIUM, chromium, dashboard_base, fresh_python, wait_until
from makers import make_cartpole

from daskcollect import DaskCollector
from daskcollect.monitoring.driver import keep_monitor
from daskcollect.monitoring.scheduler import CollectorMonitor


class Collecting:
    """Runs a collection in a thread (bounded in frames and time) while the test looks at the page."""

    def __init__(self, client: Client, seconds: float = 60):
        self.collector = DaskCollector(
            make_cartpole, frames_per_batch=200, total_frames=200 * 2000, num_collectors=2, client=client
        )
        self.stop, self.deadline = threading.Event(), time.monotonic() + seconds
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for _ in self.collector:
            if self.stop.is_set() or time.monotonic() > self.deadline:
                break

    def __enter__(self) -> DaskCollector:
        self.thread.start()
        return self.collector

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        self.collector.shutdown()


def page_json(cluster) -> dict:
    return json.loads(
        urllib.request.urlopen(dashboard_base(cluster) + "/daskcollect/json", timeout=10).read()
    )


def collecting(cluster) -> dict:
    """The collection that is collecting now, as the scheduler's page has it (``{}`` before its report).

    The page keeps the closed collections of earlier tests too; one test collects at a time."""
    return next((c for c in page_json(cluster).values() if c["state"] == "collecting"), {})


def newest(cluster) -> dict:
    """The collection that reported last."""
    return max(page_json(cluster).values(), key=lambda c: c["received"])


def wait_for_report(cluster, frames: int, points: int = 1, timeout: float = 60) -> None:
    """Until the page shows the running collection with ``frames`` frames and ``points`` points of history."""

    def shown() -> bool:
        page = collecting(cluster)
        return page.get("frames", 0) >= frames and len(page["history"]) >= points

    reached = wait_until(shown, timeout=timeout, interval=0.2)
    assert reached, (
        f"the page never showed {frames} frames and {points} points of history: {collecting(cluster)}"
    )


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_page_in_headless_chromium(cluster, client, tmp_path):
    url = dashboard_base(cluster) + "/daskcollect"
    with Collecting(client) as collector:
        wait_for_report(cluster, frames=2000, points=4)
        # The page refreshes itself every 2 s: a virtual-time budget near 2000 ms lets the refresh
        # start as the budget runs out, and Chromium then prints the empty document it navigates to.
        dom = chromium(tmp_path, "--virtual-time-budget=500", "--dump-dom", url)
        shot = os.environ.get("DASKCOLLECT_SCREENSHOT") or str(tmp_path / "dashboard.png")
        chromium(tmp_path, "--window-size=1100,900", f"--screenshot={shot}", url)
        workers = collector.workers
    assert "daskcollect: collectors" in dom and "(collecting)" in dom
    for address in workers:  # one row per collector, naming its worker
        assert address in dom
    totals = re.search(r"<table class=\"totals\".*?</table>", dom, re.S).group(0)
    cells = re.findall(r"<td>([^<]*)</td>", totals)
    assert cells[0] == "async" and int(cells[1]) >= 2000 and cells[4] == "2"  # mode, frames, live
    assert os.path.getsize(shot) > 5000  # a rendered page, not an empty image
    # The charts, as Chromium drew them: count the points of each series and the bars.
    charts = re.search(r'<div class="charts".*?</div>', dom, re.S).group(0)
    assert charts.count("<svg") == 5
    series = {name: int(n) for name, n in re.findall(r'data-series="([^"]+)" data-points="(\d+)"', charts)}
    assert series["total"] >= 3 and series["collector 0"] >= 3 and series["collector 1"] >= 3  # frames/s
    assert series["mean"] >= 3 and series["max"] >= 3  # policy lag
    assert series["return"] >= 3 and series["length"] >= 3  # episodes
    paths = re.findall(r'<path class="series"[^>]* d="([^"]+)"', charts)
    assert all(d.count("L") >= 2 for d in paths)  # drawn lines, not single points
    bars = re.findall(r'<rect class="bar" data-part="(\w+)"', charts)
    assert bars.count("env") == 2 and bars.count("policy") == 2  # one stacked bar per collector


def test_prometheus_metrics_and_json(cluster, client):
    base = dashboard_base(cluster)
    with Collecting(client):
        wait_for_report(cluster, frames=1000)
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        page = urllib.request.urlopen(base + "/daskcollect/json", timeout=10).read().decode()
    series = dict(re.findall(r'^daskcollect_frames_total\{collection="([^"]+)"\} (\S+)$', metrics, re.M))
    assert series and max(float(v) for v in series.values()) >= 1000
    assert 'daskcollect_collector_policy_version{collection="' in metrics
    assert '"live_collectors": 2' in page


def test_page_numbers_match_stats(cluster, client):
    with keep_monitor(client):  # the page outlives the collection
        with DaskCollector(
            make_cartpole, frames_per_batch=100, total_frames=2100, num_collectors=2, client=client
        ) as c:
            frames = sum(b.numel() for b in c)
            stats = c.stats()
        page = newest(cluster)  # its final report, sent at shutdown
        html = urllib.request.urlopen(dashboard_base(cluster) + "/daskcollect", timeout=10).read().decode()
    assert frames == page["frames"] == 2100 and page["state"] == "closed"
    for key in ("frames", "batches", "episodes", "episode_return_mean", "episode_length_mean", "policy_lag",
                "time_split", "restarts", "frames_lost", "live_collectors"):  # fmt: skip
        assert page[key] == stats[key], key
    for shown, row in zip(page["collectors"], stats["collectors"]):
        assert (shown["frames"], shown["episodes"], shown["episode_return_mean"]) == (
            row["frames"], row["episodes"], row["episode_return_mean"],
        )  # fmt: skip
    assert f"<td>{stats['episode_return_mean']:,.2f}</td>" in html and f"<td>{stats['episodes']}</td>" in html


def test_closed_collection_is_marked_while_the_page_is_kept_and_the_page_goes_after(cluster, client):
    with keep_monitor(client) as served:
        assert served
        with DaskCollector(
            make_cartpole, frames_per_batch=100, total_frames=400, num_collectors=2, client=client
        ) as c:
            frames = sum(b.numel() for b in c)
            assert newest(cluster)["state"] in ("ready", "collecting")
        page = newest(cluster)
    assert frames == page["frames"] == 400 and page["state"] == "closed"
    with pytest.raises(urllib.error.HTTPError, match="404"):  # the last lease out took the page
        page_json(cluster)


def test_page_without_collections():
    assert "No collection has reported yet" in CollectorMonitor().render()


def test_performance_report_around_a_collection(client, tmp_path):
    path = tmp_path / "report.html"
    with client.as_current(), performance_report(filename=str(path)):  # it reports on the current client
        with DaskCollector(
            make_cartpole, frames_per_batch=200, total_frames=1000, num_collectors=2, client=client
        ) as c:
            frames = sum(b.numel() for b in c)
    assert frames == 1000
    assert path.stat().st_size > 10_000 and "Dask Performance Report" in path.read_text()


def test_the_scheduler_plugins_load_without_torch():
    """A scheduler unpickling daskcollect's plugins (this page's, retirement, membership)
    pays for Jinja and Tornado, not for torch and tensordict (3 s and 300 MB)."""
    code = (
        "import sys\n"
        "import daskcollect.membership.driver, daskcollect.monitoring.scheduler, daskcollect.retirement.driver\n"
        "print('torch' in sys.modules, 'tensordict' in sys.modules)"
    )
    assert fresh_python(code).splitlines()[-1] == "False False"
