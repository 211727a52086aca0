"""daskcollect.scaling: the learner's demand, and the scheduler's adaptive target that takes it as a floor.

The end-to-end run, where SLURM jobs follow a learner whose pace changes 4x,
is in tests/test_slurm.py. Here the plugin runs on a real scheduler
(Dask's ``gen_cluster``) and is asked what ``Adaptive.target`` asks.
"""

from __future__ import annotations

import time

import pytest
from distributed.utils_test import gen_cluster

from daskcollect.collection.polling import apoll_until
from daskcollect.monitoring.cost import WorkerTime, resource_class
from daskcollect.monitoring.scheduler import STATS_TOPIC
from daskcollect.scaling import SCALING_PLUGIN
from daskcollect.scaling.driver import Demand
from daskcollect.scaling.scheduler import DemandScaling


def test_demand_wants_the_collectors_that_match_the_learners_pace():
    demand = Demand(headroom=1.2, window=1)  # no smoothing: the last batch decides
    collectors = [{"fps": 90.0}, {"fps": 110.0}]
    assert demand.wanted(collectors) is None  # nothing measured yet
    demand.consumed(100, 1.0)  # 100 frames/s
    assert demand.learner_fps == pytest.approx(100.0)
    assert demand.wanted(collectors) == 2  # 1.2 * 100 / 100 = 1.2 -> 2
    demand.consumed(100, 0.25)  # 4x faster
    assert demand.wanted(collectors) == 5  # 1.2 * 400 / 100 = 4.8 -> 5
    assert demand.wanted(collectors, fixed=3) == 3  # a set num_collectors wants its own workers
    assert demand.as_dict(collectors) == {"learner_fps": pytest.approx(400.0), "wanted_collectors": 5}


def test_worker_time_adds_up_each_collectors_life_by_resource_class():
    assert resource_class(None) == "any" and resource_class({"collector": 1, "GPU": 1}) == "GPU=1,collector=1"
    cost = WorkerTime({"collector": 1})
    cost.seen([1, 2])
    time.sleep(0.2)
    cost.seen([2])  # collector 1 left
    held = cost.seconds()
    assert 0.4 <= held < 1.0
    out = cost.as_dict(frames=2000)
    assert out["worker_seconds_per_kframe"]["collector=1"] == pytest.approx(
        out["worker_seconds"]["collector=1"] / 2, abs=0.01
    )
    assert cost.as_dict(frames=0)["worker_seconds_per_kframe"] == {"collector=1": None}


class Held:
    """A stand-in actor."""


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_the_adaptive_target_is_at_least_what_the_collections_want(c, s, a, b):
    await c.register_plugin(DemandScaling(), name=SCALING_PLUGIN)
    plugin = s.plugins[SCALING_PLUGIN]
    dask_alone = await c.scheduler.adaptive_target()
    assert dask_alone < 2  # idle workers: Dask alone would shrink the cluster

    await c.log_event(STATS_TOPIC, {"id": "run-1", "state": "collecting", "wanted_collectors": 5})
    assert await apoll_until(lambda: "run-1" in plugin.wanted, 10)
    assert await c.scheduler.adaptive_target() == 5
    await c.log_event(STATS_TOPIC, {"id": "run-2", "state": "collecting", "wanted_collectors": 2})
    assert await apoll_until(lambda: "run-2" in plugin.wanted, 10)
    assert await c.scheduler.adaptive_target() == 7  # two collections' demands add up

    # A worker that hosts another daskcollect actor (an inference server) stays on top, and is never closed.
    server = c.submit(Held, actor=True, key="daskcollect-inference-0", workers=[a.address])
    await server
    assert await c.scheduler.adaptive_target() == 8
    assert a.address not in await c.scheduler.workers_to_close(n=2)

    await c.log_event(STATS_TOPIC, {"id": "run-1", "state": "closed", "wanted_collectors": 5})
    await c.log_event(STATS_TOPIC, {"id": "run-2", "state": "collecting", "wanted_collectors": None})
    assert await apoll_until(lambda: not plugin.wanted, 10)
    assert await c.scheduler.adaptive_target() < 2  # Dask's own target again (the actor counts as one task)
    del server
    await c.unregister_scheduler_plugin(SCALING_PLUGIN)
