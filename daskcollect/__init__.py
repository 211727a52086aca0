"""daskcollect: TorchRL rollout collection on Dask clusters.

The public names:

- :class:`DaskCollector`, a TorchRL ``BaseCollector`` whose collectors live in
  Dask worker processes as actors;
- :class:`DaskLLMCollector`, the same for TorchRL's ``LLMCollector`` (dialog turns);
- :class:`MemmapBatch`, the handle yielded with ``output="memmap"``;
- :class:`DaskReplayBuffer`, a TorchRL replay buffer living on a worker;
- :class:`DaskWeightSyncScheme` and :class:`DaskWeightUpdater`, daskcollect's
  weight route for TorchRL's ``weight_sync_schemes=`` / ``weight_updater=``;
- the typed exceptions of :mod:`daskcollect.errors`.

Importing daskcollect registers its defaults under ``dask.config``'s
``daskcollect`` key and nothing else. ``DaskCollector``, ``DaskLLMCollector``
and ``MemmapBatch`` load torch, tensordict and TorchRL on first use, so that a worker unpickling
daskcollect's plugin, or ``daskcollect --help``, does not pay for them. Dask
serializers are registered when a collector is built (and on each worker by
its plugin).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from daskcollect import settings as _settings  # noqa: F401  (registers the dask.config defaults)
from daskcollect._imports import on_import
from daskcollect.errors import (
    ClusterConnectionError,
    CollectorBuildError,
    CollectorClosedError,
    CollectorLostError,
    CollectorTimeoutError,
    ConfigurationError,
    DaskCollectError,
    DaskVersionError,
    EndlessCollectionError,
    EnvConstructionError,
    InferenceServerLostError,
    JobsPendingError,
    NotEnoughWorkersError,
    PolicyFactoryError,
    PolicySerializationError,
    ReplayBufferLostError,
    RolloutError,
    SharedFilesystemError,
)

if TYPE_CHECKING:
    from daskcollect.collection.memmap import MemmapBatch
    from daskcollect.collector import DaskCollector
    from daskcollect.llm.collector import DaskLLMCollector
    from daskcollect.replay_buffer import DaskReplayBuffer
    from daskcollect.weights.scheme import DaskWeightSyncScheme, DaskWeightUpdater

__version__ = "0.1.0"


def _register_torchrl_backend() -> None:
    from daskcollect.collection import backend

    backend.register()


# Collector(backend="dask") and torchrl.service_backend("dask"): added when TorchRL's collectors load.
on_import("torchrl.collectors", _register_torchrl_backend)

_LAZY = {
    "DaskCollector": "daskcollect.collector",
    "DaskLLMCollector": "daskcollect.llm.collector",
    "DaskReplayBuffer": "daskcollect.replay_buffer",
    "MemmapBatch": "daskcollect.collection.memmap",
    "DaskWeightSyncScheme": "daskcollect.weights.scheme",
    "DaskWeightUpdater": "daskcollect.weights.scheme",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'daskcollect' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ClusterConnectionError",
    "CollectorBuildError",
    "CollectorClosedError",
    "CollectorLostError",
    "CollectorTimeoutError",
    "ConfigurationError",
    "DaskCollectError",
    "DaskCollector",
    "DaskLLMCollector",
    "DaskReplayBuffer",
    "DaskVersionError",
    "DaskWeightSyncScheme",
    "DaskWeightUpdater",
    "EndlessCollectionError",
    "EnvConstructionError",
    "MemmapBatch",
    "JobsPendingError",
    "NotEnoughWorkersError",
    "PolicyFactoryError",
    "PolicySerializationError",
    "InferenceServerLostError",
    "ReplayBufferLostError",
    "RolloutError",
    "SharedFilesystemError",
    "__version__",
]
