"""daskcollect: TorchRL rollout collection on Dask clusters.

The public names:

- :class:`DaskCollector`, a TorchRL ``BaseCollector`` whose collectors live in
  Dask worker processes as actors;
- the typed exceptions of :mod:`daskcollect.errors`.
"""

from __future__ import annotations

from daskcollect import config as _config  # noqa: F401  (registers dask.config defaults)
from daskcollect.collector import DaskCollector
from daskcollect.errors import (
    ClusterConnectionError,
    CollectorBuildError,
    CollectorClosedError,
    CollectorLostError,
    CollectorTimeoutError,
    ConfigurationError,
    DaskCollectError,
    EndlessCollectionError,
    EnvConstructionError,
    NotEnoughWorkersError,
    PolicyFactoryError,
    PolicySerializationError,
    RolloutError,
    SharedFilesystemError,
)
from daskcollect.memmap import MemmapBatch

__version__ = "0.1.0"

__all__ = [
    "ClusterConnectionError",
    "CollectorBuildError",
    "CollectorClosedError",
    "CollectorLostError",
    "CollectorTimeoutError",
    "ConfigurationError",
    "DaskCollectError",
    "DaskCollector",
    "MemmapBatch",
    "EndlessCollectionError",
    "EnvConstructionError",
    "NotEnoughWorkersError",
    "PolicyFactoryError",
    "PolicySerializationError",
    "RolloutError",
    "SharedFilesystemError",
    "__version__",
]
