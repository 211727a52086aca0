"""Central batched inference over Dask: env-only collectors, policy servers placed by Dask resources.

- :mod:`~daskcollect.inference.driver`: :class:`InferenceServers`, which starts,
  feeds and replaces the servers (runs on the driver);
- :mod:`~daskcollect.inference.worker`: :class:`InferenceActor`, TorchRL's
  ``InferenceServer`` in a Dask actor (runs on a server's worker);
- :mod:`~daskcollect.inference.transport`: TorchRL's ``InferenceTransport``
  over Dask comms (runs on the collectors' and the servers' workers);
- :mod:`~daskcollect.inference.options`: the ``inference_*`` keywords, validated.

``DaskCollector(inference="server")`` uses them (docs/central_inference.md).
"""
