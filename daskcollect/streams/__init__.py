"""Completion streams: rollout requests out and finished rollouts back, one Dask comm per collector.

- :mod:`~daskcollect.streams.driver`: the driver's end (runs on the driver);
- :mod:`~daskcollect.streams.worker`: the worker's end (runs on each worker);
- :mod:`~daskcollect.streams.serialization`: the Dask serializers for
  TensorDicts (registered on both ends).
"""
