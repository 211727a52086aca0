"""Surviving the driver: what a driver that dies leaves is removed, or waits for a new driver to take it over.

- :mod:`~daskcollect.reattach.scheduler`: :class:`OrphanSweeper`, the scheduler
  plugin that removes a dead driver's leftovers after its grace period (runs
  on the scheduler);
- :mod:`~daskcollect.reattach.driver`: the published record of a run's actors
  and the claim of a new driver (runs on the driver).
"""
