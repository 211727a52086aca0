"""Workers that join and leave, learned from the scheduler's events rather than by asking it.

- :mod:`~daskcollect.membership.driver`: :class:`ClusterEvents` (runs on the
  driver); the scheduler side is Dask's own: it logs every worker it adds or
  removes.
"""
