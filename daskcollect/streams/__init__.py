"""Completion streams: rollout requests out and finished rollouts back, one Dask comm per collector.

- :mod:`~daskcollect.streams.driver`: the driver's end (runs on the driver);
- :mod:`~daskcollect.streams.worker`: the worker's end (runs on each worker);
- :mod:`~daskcollect.streams.local`: same-host channels, which carry the rollouts of collectors
  on the driver's host off Dask's event loop (both ends);
- :mod:`~daskcollect.streams.packing`: one buffer per rollout, its layout sent once per stream;
- :mod:`~daskcollect.streams.serialization`: the Dask serializers for
  TensorDicts (registered on both ends).
"""
