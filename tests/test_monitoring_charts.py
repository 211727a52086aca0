"""The scheduler's history and the page's SVG charts, fed snapshots as a collector sends them."""

from __future__ import annotations

import re

from daskcollect.monitoring.charts import nice_max
from daskcollect.monitoring.scheduler import STATS_TOPIC, CollectorMonitor


def snapshot(t: float, frames: int, restarts: int = 0, lost: int = 0, uid: int = 0) -> dict:
    split = {"env": 0.05, "policy": 0.03, "weights": 0.0, "output": 0.001, "other": 0.01}
    return {
        "id": "c1", "state": "collecting", "time": t, "frames": frames, "restarts": restarts,
        "env_restarts": 0, "rollouts_lost": lost, "policy_lag": 0.5, "policy_lag_max": 1,
        "episode_return_mean": frames / 1000, "episode_length_mean": 20.0,
        "collectors": [
            {"index": 0, "collector_id": uid, "frames": frames // 2, "time_split": split},
            {"index": 1, "collector_id": 1, "frames": frames // 2, "time_split": split},
        ],
    }  # fmt: skip


def test_history_rates_marks_and_span():
    monitor = CollectorMonitor(history=30)
    for i in range(40):  # one report a second, 40 s: the first 10 fall out of the 30 s span
        restarts = 1 if i >= 20 else 0
        monitor.log_event(STATS_TOPIC, snapshot(1000.0 + i, 1000 * i, restarts, lost=restarts, uid=restarts))
    monitor.log_event(STATS_TOPIC, snapshot(1039.0, 39_000))  # a repeated report adds nothing
    history = monitor.histories["c1"]
    assert len(history.points) == 31 and history.points[0]["t"] == 1009.0
    assert all(p["fps"] == 1000 for p in history.points)
    rates = history.collector_series()
    # Collector 0 was replaced at t=1020 (new incarnation): its rate counts from 0 there.
    assert dict(rates[0])[1020.0] == 10_000 and dict(rates[0])[1021.0] == 500
    assert sorted(history.marks()) == [(1020.0, "lost rollout"), (1020.0, "restart")]


def test_charts_draw_every_series_and_the_marks():
    monitor = CollectorMonitor(history=300)
    for i in range(10):
        monitor.log_event(STATS_TOPIC, snapshot(1000.0 + i, 1000 * i, restarts=int(i >= 5)))
    page = monitor.render()
    series = dict(re.findall(r'data-series="([^"]+)" data-points="(\d+)"', page))
    # Rates need two reports: 9 points of frames/s; the copied figures have all 10.
    assert series == {"total": "9", "collector 0": "9", "collector 1": "9", "mean": "10", "max": "10",
                      "return": "10", "length": "10"}  # fmt: skip
    assert page.count('class="mark" data-mark="restart"') == 4  # one per line chart
    assert page.count('<rect class="bar"') == 2 * 4  # two collectors, four parts above zero


def test_one_report_draws_no_chart_and_names_are_escaped():
    monitor = CollectorMonitor()
    monitor.log_event(STATS_TOPIC, {**snapshot(1.0, 0), "name": "<script>x</script>"})
    page = monitor.render()
    assert "<svg" not in page and "<script>x" not in page


def test_nice_max():
    assert [nice_max(v) for v in (0, 0.3, 1, 3, 7, 12, 2600)] == [1, 0.5, 1, 5, 10, 20, 5000]
