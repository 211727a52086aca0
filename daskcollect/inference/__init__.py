"""Central batched inference over Dask: env-only collectors, policy servers placed by Dask resources.

:mod:`~daskcollect.inference.transport` is TorchRL's ``InferenceTransport``
over Dask comms; :mod:`~daskcollect.inference.server` hosts TorchRL's
``InferenceServer`` in Dask actors. ``DaskCollector(inference="server")``
uses both (docs/central_inference.md).
"""
