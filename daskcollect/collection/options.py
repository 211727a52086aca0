"""Frozen option groups behind :class:`~daskcollect.DaskCollector`'s keyword arguments.

The constructor keeps TorchRL's ``RayCollector`` keywords as its public face and
groups them here, validated once, so that the rest of the library passes three
small immutable objects around instead of forty arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from daskcollect.deploy.py_modules import resolve
from daskcollect.errors import ConfigurationError


@dataclass(frozen=True)
class BatchOptions:
    """What the iterator yields and when it stops.

    Attributes:
        frames_per_batch: Frames in each yielded batch (sync: split evenly
            over the collectors, rounded up).
        total_frames: Frames to collect in one pass; ``-1`` is endless.
        sync: Stack one share of every collector per batch (``True``), or yield
            each collector's batch as soon as it is ready (``False``).
        split_trajs: Apply TorchRL's ``split_trajectories`` on the driver.
        postproc: A callable applied to each batch on the driver.
    """

    frames_per_batch: int
    total_frames: int = -1
    sync: bool = False
    split_trajs: bool = False
    postproc: Callable[[Any], Any] | None = None

    def __post_init__(self):
        if isinstance(self.frames_per_batch, bool) or not isinstance(self.frames_per_batch, int):
            raise ConfigurationError(
                f"frames_per_batch must be an int, got {self.frames_per_batch!r}. "
                "Pass the number of frames each batch should hold, e.g. frames_per_batch=1000."
            )
        if self.frames_per_batch <= 0:
            raise ConfigurationError(
                f"frames_per_batch must be > 0, got {self.frames_per_batch}. "
                "Pass the number of frames each batch should hold, e.g. frames_per_batch=1000."
            )
        if not isinstance(self.total_frames, int) or self.total_frames == 0 or self.total_frames < -1:
            raise ConfigurationError(
                f"total_frames must be -1 (endless) or > 0, got {self.total_frames!r}. "
                "Pass total_frames=-1 to collect until you break out of the loop."
            )

    @property
    def num_batches(self) -> int | None:
        """Batches in one pass, or ``None`` when endless."""
        if self.total_frames < 0:
            return None
        return math.ceil(self.total_frames / self.frames_per_batch)

    def frames_per_collector(self, num_collectors: int) -> int:
        """Frames each collector gathers per rollout."""
        if self.sync:
            return math.ceil(self.frames_per_batch / num_collectors)
        return self.frames_per_batch


@dataclass(frozen=True)
class WeightOptions:
    """When the workers' policies are refreshed (TorchRL's meanings).

    Attributes:
        update_after_each_batch: Push the driver policy's weights after every
            batch (sync: to all; async: to the collector that produced it).
        max_weight_update_interval: A collector that produced more than this
            many batches since its last update is refreshed; ``-1`` disables.
        track_policy_version: Write the weights' version under the
            ``"policy_version"`` key of every frame.
        max_policy_lag: Async mode: no batch is yielded more than this many
            versions behind the driver's weights; ``None``: no bound.
        updater: TorchRL's legacy ``weight_updater``, or ``None``.
        schemes: TorchRL's ``weight_sync_schemes`` (``{"policy": scheme}``),
            or ``None`` with an ``updater``.
    """

    update_after_each_batch: bool = False
    max_weight_update_interval: int = -1
    track_policy_version: bool = False
    updater: Any = None
    schemes: Mapping[str, Any] | None = None
    max_policy_lag: int | None = None

    def __post_init__(self):
        lag = self.max_policy_lag
        if lag is not None and (not isinstance(lag, int) or isinstance(lag, bool) or lag < 1):
            raise ConfigurationError(
                f"max_policy_lag must be an int >= 1 or None, got {lag!r}. A lag of 0 is sync mode: "
                "pass sync=True."
            )
        if not isinstance(self.max_weight_update_interval, int) or self.max_weight_update_interval < -1:
            raise ConfigurationError(
                f"max_weight_update_interval must be an int >= -1, got "
                f"{self.max_weight_update_interval!r}. Use -1 to disable forced updates."
            )


@dataclass(frozen=True)
class ClusterOptions:
    """Where the collectors run.

    Attributes:
        client: A ``distributed.Client``, a scheduler address, or ``None`` for a
            private ``LocalCluster``.
        scheduler_file: A scheduler file, instead of ``client``.
        worker_env: Environment variables set on each worker before any env
            or policy is built.
        worker_resources: Resources a worker must declare to host a collector.
        security: A ``distributed.security.Security`` for TLS clusters; taken
            from ``client`` when one is given.
        py_modules: The user's modules to upload to every worker, resolved to
            files and package folders here (:mod:`daskcollect.deploy.py_modules`).
    """

    client: Any = None
    scheduler_file: str | None = None
    worker_env: Mapping[str, str] = field(default_factory=dict)
    worker_resources: Mapping[str, float] | None = None
    security: Any = None
    py_modules: Any = ()

    def __post_init__(self):
        if self.client is not None and self.scheduler_file is not None:
            raise ConfigurationError("Pass either client= or scheduler_file=, not both.")
        env = self.worker_env or {}
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ConfigurationError(
                f"worker_env must map str to str, got {self.worker_env!r}. "
                'Convert values to strings, e.g. worker_env={"OMP_NUM_THREADS": "1"}.'
            )
        object.__setattr__(self, "worker_env", dict(env))
        # Found here, before any cluster starts: a wrong name fails at once.
        object.__setattr__(self, "py_modules", tuple(resolve(self.py_modules)) if self.py_modules else ())
        res = self.worker_resources
        if res is not None and (
            not isinstance(res, Mapping)
            or not all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in res.items())
        ):
            raise ConfigurationError(
                f'worker_resources must map str to a number, got {res!r}, e.g. worker_resources={{"GPU": 1}}.'
            )


@dataclass(frozen=True)
class OutputOptions:
    """What the iterator yields: TensorDicts, memmap handles, or ``None`` with a replay buffer.

    Attributes:
        output: ``"tensordict"`` (batches travel through Dask) or ``"memmap"``
            (workers write to ``memmap_dir``; :class:`~daskcollect.MemmapBatch`
            handles travel).
        memmap_dir: A folder that the driver and every worker can see.
        memmap_retention: ``"release"`` (delete on ``handle.release()``),
            ``"keep"`` (never delete, not even at shutdown), or an int ``K``
            (keep the last ``K`` yielded batches).
        max_unreleased: Bound on rollout folders on disk not yet released; no
            new rollout starts while it is reached.
        replay_buffer: A TorchRL ``ReplayBuffer`` extended with each batch.
        trace_frames: Label every frame with the collector, incarnation and
            rollout that made it.
    """

    output: str = "tensordict"
    memmap_dir: str | None = None
    memmap_retention: str | int = "release"
    max_unreleased: int = 16
    replay_buffer: Any = None
    trace_frames: bool = True

    def __post_init__(self):
        if self.output not in ("tensordict", "memmap"):
            raise ConfigurationError(f"output must be 'tensordict' or 'memmap', got {self.output!r}.")
        if self.memmap:
            if not self.memmap_dir:
                raise ConfigurationError(
                    "output='memmap' needs memmap_dir=, a folder that the driver and every worker "
                    "can see (a shared filesystem)."
                )
            object.__setattr__(self, "memmap_dir", str(self.memmap_dir))
        retention = self.memmap_retention
        if not (retention in ("release", "keep") or (isinstance(retention, int) and retention >= 1)):
            raise ConfigurationError(
                f"memmap_retention must be 'release', 'keep' or an int >= 1, got {retention!r}."
            )
        if not isinstance(self.max_unreleased, int) or self.max_unreleased < 1:
            raise ConfigurationError(f"max_unreleased must be an int >= 1, got {self.max_unreleased!r}.")

    @property
    def memmap(self) -> bool:
        return self.output == "memmap"


@dataclass(frozen=True)
class FaultOptions:
    """What happens when a collector fails.

    Attributes:
        max_collector_restarts: Total replacements (lost workers, stuck
            rollouts, env rebuilds) before :class:`~daskcollect.CollectorLostError`.
        on_env_error: ``"raise"`` (a :class:`~daskcollect.RolloutError` on the
            driver) or ``"restart"`` (rebuild that collector, drop the
            rollout, count it, go on).
    """

    max_collector_restarts: int = 100
    on_env_error: str = "raise"

    def __post_init__(self):
        if not isinstance(self.max_collector_restarts, int) or self.max_collector_restarts < 0:
            raise ConfigurationError(
                f"max_collector_restarts must be an int >= 0, got {self.max_collector_restarts!r}."
            )
        if self.on_env_error not in ("raise", "restart"):
            raise ConfigurationError(f"on_env_error must be 'raise' or 'restart', got {self.on_env_error!r}.")
