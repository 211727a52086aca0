"""Scaling to demand: Dask's ``Adaptive`` follows what the learner consumes.

Dask's ``Adaptive`` asks the scheduler's ``adaptive_target`` how many workers
it wants. That count comes from task occupancy and memory: actor calls never
count, so workers that host collectors look idle, and ``Adaptive`` would keep
the cluster at its minimum whatever the learner needs.

Each collection measures its demand on the driver (:class:`~daskcollect.scaling.driver.Demand`):
the frames per second its learner consumes while it is not waiting for a batch,
against the frames per second a collector makes. It sends the number of
collectors that would keep the learner fed with its stats, once a second. The
scheduler plugin (:class:`~daskcollect.scaling.scheduler.DemandScaling`)
wraps ``adaptive_target``: the target is the larger of Dask's own and the
collections' wanted collectors. Any cluster's stock ``Adaptive`` then follows
the learner: dask-jobqueue's ``adapt(minimum_jobs=..., maximum_jobs=...)``
included, within its bounds. Closing a collector's worker stays graceful
(:mod:`daskcollect.retirement`): ``Adaptive`` retires before it closes, and
the retirement hook delivers the rollout in flight first. The plugin's
``valid_workers_downscaling`` keeps Dask from choosing a worker that hosts a
daskcollect actor that cannot be replaced without loss (an inference server,
a replay buffer).

The plugin is leased by every collection; the last one out puts Dask's
handler back.
"""

from __future__ import annotations

SCALING_PLUGIN = "daskcollect-demand-scaling"
