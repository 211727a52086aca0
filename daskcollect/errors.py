"""Typed exceptions. Each message names the cause and the fix.

Every class subclasses :class:`DaskCollectError` and the built-in exception a
caller would naturally catch (``ValueError``, ``TimeoutError``...). They pickle
with their details, so errors raised on a worker arrive intact on the driver.
"""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[DaskCollectError], message: str, details: dict[str, Any]):
    return cls(message, **details)


class DaskCollectError(Exception):
    """Base class of every daskcollect error.

    Args:
        message: The full message, with the cause and the fix.
        **details: Structured fields (worker address, collector index...)
            exposed as attributes.
    """

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.details = details
        for key, value in details.items():
            setattr(self, key, value)

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.details))


class ConfigurationError(DaskCollectError, ValueError):
    """An argument of :class:`~daskcollect.DaskCollector` is invalid."""


class EndlessCollectionError(DaskCollectError, TypeError):
    """``len()`` of a collector with ``total_frames=-1``."""


class PolicySerializationError(DaskCollectError, TypeError):
    """The policy or an env constructor cannot be pickled for the workers."""


class ClusterConnectionError(DaskCollectError, ConnectionError):
    """The Dask scheduler cannot be reached."""


class SharedFilesystemError(DaskCollectError, OSError):
    """``memmap_dir`` is missing or not writable on the driver or a worker."""


class NotEnoughWorkersError(DaskCollectError, TimeoutError):
    """Too few eligible workers joined the cluster in time."""


class JobsPendingError(NotEnoughWorkersError):
    """Too few workers joined because the cluster's batch jobs wait in the job scheduler's queue.

    ``jobs`` maps each job's id to its state and the scheduler's reason, such as
    ``"PENDING (Resources)"``.
    """


class CollectorBuildError(DaskCollectError, RuntimeError):
    """A collector could not be built on its worker."""


class EnvConstructionError(CollectorBuildError):
    """An env constructor raised on a worker."""


class PolicyFactoryError(CollectorBuildError):
    """A ``policy_factory`` raised on a worker."""


class RolloutError(DaskCollectError, RuntimeError):
    """A rollout raised on a worker (env step, policy forward...)."""


class CollectorLostError(DaskCollectError, RuntimeError):
    """Collectors failed more often than ``max_collector_restarts`` allows."""


class CollectorTimeoutError(DaskCollectError, TimeoutError):
    """A call to the workers did not finish within its configured timeout."""


class CollectorClosedError(DaskCollectError, RuntimeError):
    """The collector was used after :meth:`~daskcollect.DaskCollector.shutdown`."""


class DaskVersionError(DaskCollectError, RuntimeError):
    """The installed ``distributed`` lacks an internal that daskcollect relies on."""


class ReplayBufferLostError(DaskCollectError, RuntimeError):
    """The worker holding a :class:`~daskcollect.DaskReplayBuffer` is gone, or does not answer."""


class InferenceServerLostError(DaskCollectError, ConnectionError):
    """An inference server (``inference="server"``) is gone, or its channel from a collector closed."""
