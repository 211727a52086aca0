"""Policy weights: extraction and payload, a router that owns versions, one module per transport.

- :mod:`~daskcollect.weights.payload`: weights taken from a policy with
  TorchRL's ``WeightStrategy`` and packed with ``TensorDict.consolidate``;
- :mod:`~daskcollect.weights.router`: versions, what each collector still has
  to load, and which transport reaches it;
- :mod:`~daskcollect.weights.shm`: one write into shared memory for workers on
  the driver's host;
- :mod:`~daskcollect.weights.scatter`: one Dask scatter for workers elsewhere,
  copied host to host along a binomial tree (:mod:`~daskcollect.weights.tree`);
- :mod:`~daskcollect.weights.scheme`: the route as TorchRL's ``WeightSyncScheme``
  and legacy ``WeightUpdaterBase``, for ``weight_sync_schemes=`` / ``weight_updater=``.

Both transports answer :meth:`send` with a :class:`~daskcollect.weights.payload.Sent`
whose ``ref`` travels with a rollout call and is read on the worker.
"""

from __future__ import annotations

from daskcollect.weights.payload import Sent, WeightsPayload, extract_weights
from daskcollect.weights.router import WeightRouter

__all__ = ["Sent", "WeightRouter", "WeightsPayload", "extract_weights"]
