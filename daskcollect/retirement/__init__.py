"""Graceful retirement of workers that host collectors: a scheduler plugin and the driver's watcher.

Dask refuses to retire a worker that holds an actor (an actor cannot move), and
``SpecCluster.scale`` down, ``Adaptive``, ``Client.retire_workers`` and a
worker's ``--lifetime`` all go through ``Scheduler.retire_workers``. A refused
retirement of a scaled-down worker is followed by a plain close, so the
collector's rollout in flight would be lost.

:class:`GracefulRetirement` wraps the scheduler's ``retire_workers`` handler.
Before Dask's own retirement starts, it announces the leaving workers on the
:data:`RETIRING_TOPIC` event topic and waits (bounded by
``daskcollect.timeouts.retire``) until every daskcollect actor on them has been
released. On the driver, each collection's :class:`RetirementWatcher` listens
on that topic: it stops calls to those collectors, lets the calls in flight
finish (their batches are yielded as usual), closes the collectors and
releases the actors, and hands the released slots to the engine, which counts
them and reconciles. Dask's retirement then proceeds as for any worker.
Without daskcollect actors on the leaving workers, the call goes to Dask's own
handler unchanged. A collector's worker that retires itself (``--lifetime``) is
removed from the scheduler when it disconnects rather than at once, so that a
heartbeat racing its close cannot make it close its nanny too
(``--lifetime-restart`` workers then come back every time).

The plugin is shared by the collections on a scheduler
(:mod:`daskcollect.leases.driver`): the last one to close removes it, and
Dask's handler is back as it was.
"""

from __future__ import annotations

#: The key prefix of every daskcollect actor (the pool names them), by which
#: the scheduler plugin tells them from other actors.
ACTOR_KEY_PREFIX = "daskcollect-actor-"

RETIRING_TOPIC = "daskcollect-retiring"
RETIREMENT_PLUGIN = "daskcollect-graceful-retirement"
