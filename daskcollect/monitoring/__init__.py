"""Monitoring: typed stats, the reporter that sends them to the scheduler, and the dashboard page.

- :mod:`~daskcollect.monitoring.stats`: :class:`CollectionStats`,
  :class:`CollectorStats` and :class:`FailureCounters`;
- :mod:`~daskcollect.monitoring.driver`: :class:`Reporter`, which sends a
  snapshot to the scheduler at most once per report interval;
- :mod:`~daskcollect.monitoring.scheduler`: the scheduler plugin that serves
  ``/daskcollect``, ``/daskcollect/json`` and the Prometheus series.
"""

from __future__ import annotations

from daskcollect.monitoring.stats import CollectionStats, CollectorStats, FailureCounters

__all__ = ["CollectionStats", "CollectorStats", "FailureCounters"]
