"""``DaskCollector``: TorchRL's collector contract on Dask actors (a façade; runs on the driver).

The keywords become a validated :class:`~daskcollect.collection.spec.CollectionSpec`;
a :class:`~daskcollect.collection.session.Session` opens and closes what the
collection holds; batches come from :mod:`daskcollect.collection.iteration`
(sync: every collector's share stacked ``[N, ...]``, as ``MultiSyncCollector``;
async: whichever collector finished first, re-armed before its batch is
yielded) through the output stage, :mod:`daskcollect.collection.output`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase
from torchrl.collectors import BaseCollector, Collector

from daskcollect import _internals
from daskcollect.collection import checkpoint
from daskcollect.collection.background import BackgroundAPI, BackgroundCollection
from daskcollect.collection.checkpoint import CheckpointAPI
from daskcollect.collection.iteration import batches
from daskcollect.collection.memmap import MemmapBatch
from daskcollect.collection.output import Output
from daskcollect.collection.session import Session
from daskcollect.collection.spec import CollectionSpec
from daskcollect.deploy.handle import close_at_exit
from daskcollect.errors import CollectorClosedError, ConfigurationError, EndlessCollectionError
from daskcollect.monitoring import display
from daskcollect.monitoring.driver import check_logger
from daskcollect.settings import Settings
from daskcollect.weights.scheme import WeightsAPI

#: TorchRL collectors' default ``exploration_type``.
DEFAULT_EXPLORATION_TYPE = _internals.default_exploration_type()


class DaskCollector(WeightsAPI, BackgroundAPI, CheckpointAPI, BaseCollector):
    """Collects TorchRL rollouts on a Dask cluster, one long-lived actor per worker.

    The keyword names, defaults and meanings follow
    :class:`torchrl.collectors.distributed.RayCollector`, so code written for
    Ray runs with the class name changed.

    Args:
        create_env_fn: An env constructor (callable or ``EnvCreator``), an
            ``EnvBase`` instance (shipped pickled, with its state: transform
            statistics set on the driver arrive intact), or a list of them,
            one per collector.
        policy: The policy module, copied to every worker; ``None``: a random
            policy (or ``policy_factory``).

    Keyword Args:
        policy_factory: A callable (or one per collector) that builds the
            policy on the worker instead of shipping one.
        frames_per_batch: Frames per yielded batch.
        total_frames: Frames per pass over the collector; ``-1`` is endless.
        device: A device, or one per collector, as in TorchRL's collectors.
        storing_device: As ``device``, for the collected data.
        env_device: As ``device``, for the envs.
        policy_device: As ``device``, for the policy.
        max_frames_per_traj: To each worker's TorchRL collector, over ``collector_kwargs``, as in Ray.
        reset_at_each_iter: As ``max_frames_per_traj``.
        exploration_type: As ``max_frames_per_traj``.
        init_random_frames: Split over the collectors, then as ``max_frames_per_traj``.
        postproc: Applied to each batch on the driver.
        split_trajs: Apply ``split_trajectories`` to each batch on the driver.
        collector_class: The TorchRL collector run on each worker:
            ``Collector`` (default), ``MultiSyncCollector``... or ``"single"``,
            ``"sync"``, ``"async"``.
        collector_kwargs: Extra keyword arguments for ``collector_class``, a
            dict or one per collector.
        num_workers_per_collector: Envs per worker. With ``Collector`` they run
            in a ``ParallelEnv``; with a multi-process class, one process each.
        sync: Stack one share of every collector per batch (see module doc).
        num_collectors: Defaults to ``len(create_env_fn)`` for a list, else the
            number of eligible workers of a given cluster, else the CPU count.
        update_after_each_batch: Push the driver policy's weights after every batch.
        max_weight_update_interval: Refresh a collector that produced more than
            this many batches on its current weights; ``-1`` disables.
        track_policy_version: Write the weights' version under
            ``"policy_version"`` (and ``("next", "policy_version")``) in every frame.
        max_policy_lag: Async mode: a bound on how many weight versions a
            yielded batch may be behind the driver's, kept by pacing the
            collectors, never by dropping frames (docs/api.md); ``None``: none.
        trace_frames: Label every frame with ``("collector", "index")``,
            ``"collector_id"`` (the incarnation) and ``"rollout_id"``;
            ``False`` leaves them out, at no cost.
        weight_sync_schemes: As in ``RayCollector``: ``{"policy": scheme}``.
            The default is ``{"policy": DaskWeightSyncScheme()}``;
            ``NoWeightSyncScheme()`` turns updates off, and a
            ``RayWeightSyncScheme`` is replaced by a ``DaskWeightSyncScheme``.
        weight_updater: As in ``RayCollector``: TorchRL's legacy
            ``WeightUpdaterBase`` (instance or class), e.g.
            :class:`~daskcollect.DaskWeightUpdater` or your subclass of it,
            instead of ``weight_sync_schemes``.
        client: A ``distributed.Client``, a scheduler address, or ``None`` for
            a private loopback ``LocalCluster`` closed at shutdown.
        scheduler_file: A scheduler file, instead of ``client``.
        worker_env: Environment variables set on each worker, with no restart,
            before any env or policy is built.
        worker_resources: Resources a worker must declare to host a
            collector, e.g. ``{"GPU": 1}``.
        py_modules: Your own modules that the env constructor or policy
            comes from, for workers that do not have them (Ray's
            ``runtime_env`` ``py_modules``): modules, module names, or paths
            of ``.py`` files or package folders. Each is uploaded with Dask's
            ``UploadFile`` plugin to every worker, and to workers that join.
        seed: If given, ``set_seed(seed)`` runs once the collectors exist.
        security: A ``distributed.security.Security`` for TLS clusters.
        trust_policy: As in ``RayCollector``.
        use_env_creator: As in ``RayCollector``.
        no_cuda_sync: As in ``RayCollector``.
        trajs_per_batch: As in ``RayCollector``.
        pre_collect_hook: As in ``RayCollector``.
        post_collect_hook: As in ``RayCollector``.
        replay_buffer: Each batch extends it on the driver and the iterator
            yields ``None`` (TorchRL's semantics).
        output: ``"tensordict"`` (default) or ``"memmap"``: workers write each
            rollout to ``memmap_dir`` and the iterator yields
            :class:`~daskcollect.MemmapBatch` handles.
        memmap_dir: The shared folder that memmap output is written to.
        memmap_retention: When rollout folders are deleted: ``"release"``,
            ``"keep"`` or keep-last ``K`` (docs/api.md).
        max_unreleased: The back-pressure bound: rollout folders not yet released.
        max_collector_restarts: Replacements of lost or stuck collectors and
            env rebuilds allowed in total (docs/fault_tolerance.md).
        on_env_error: ``"raise"`` (default) or ``"restart"`` the collector.
        logger: A TorchRL ``Logger`` (``torchrl.record.loggers``): each report
            interval it gets the scalars of :meth:`stats` (``collector/fps``,
            ``collector/episode_return_mean``...), the frame count as the step.
            One that raises is warned about once and never stops collection.
        inference: ``"server"``: central batched inference. The policy runs
            on ``inference_workers`` TorchRL ``InferenceServer``s, in Dask
            actors on workers that declare ``inference_resources`` (e.g.
            ``{"GPU": 1}``); the collectors run envs only and ask a server
            for each step's action (docs/central_inference.md). ``None``:
            each collector runs its own copy of the policy.
        inference_workers: Inference servers, one per worker; a lost one is
            started again on another eligible worker.
        inference_resources: Resources a worker must declare to host one.
        inference_options: ``max_batch_size`` (default 64), ``device``
            (where the servers run the policy, e.g. ``"cuda"``),
            ``torch_threads`` (default: the worker's ``nthreads``) and
            ``max_in_flight`` (requests a collector leaves unanswered, 1).
        resume_from: A checkpoint (:meth:`state_dict`) to continue, as
            :meth:`load_state_dict` does. Where its driver died within
            ``daskcollect.reattach.grace-period``, on the same cluster, its
            collectors are taken over as they run, with no env built again
            (docs/long_runs.md).
        restore_envs: With ``resume_from``, as :meth:`load_state_dict`'s.

    Examples:
        >>> from daskcollect import DaskCollector
        >>> from torchrl.envs import GymEnv
        >>> with DaskCollector(lambda: GymEnv("CartPole-v1"), frames_per_batch=200,
        ...                    total_frames=1000, num_collectors=2) as collector:
        ...     for batch in collector:
        ...         print(batch.shape)
        torch.Size([200])
        ...
    """

    def __init__(
        self,
        create_env_fn: Callable | Sequence[Callable],
        policy: Callable | None = None,
        *,
        policy_factory: Callable | Sequence[Callable] | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        max_frames_per_traj: int = -1,
        init_random_frames: int = -1,
        reset_at_each_iter: bool = False,
        postproc: Callable | None = None,
        split_trajs: bool = False,
        exploration_type: Any = DEFAULT_EXPLORATION_TYPE,
        collector_class: Any = Collector,
        collector_kwargs: dict | Sequence[dict] | None = None,
        num_workers_per_collector: int = 1,
        sync: bool = False,
        num_collectors: int | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        track_policy_version: bool = False,
        trace_frames: bool = True,
        max_policy_lag: int | None = None,
        weight_sync_schemes: Mapping[str, Any] | None = None,
        weight_updater: Any = None,
        client: Any = None,
        scheduler_file: str | None = None,
        worker_env: dict[str, str] | None = None,
        worker_resources: dict[str, float] | None = None,
        py_modules: Sequence[Any] | None = None,
        seed: int | None = None,
        security: Any = None,
        trust_policy: bool | None = None,
        use_env_creator: bool = False,
        no_cuda_sync: bool | None = None,
        trajs_per_batch: int | None = None,
        pre_collect_hook: Callable | None = None,
        post_collect_hook: Callable | None = None,
        replay_buffer: Any = None,
        output: str = "tensordict",
        memmap_dir: str | None = None,
        memmap_retention: str | int = "release",
        max_unreleased: int | None = None,
        max_collector_restarts: int | None = None,
        on_env_error: str = "raise",
        logger: Any = None,
        inference: str | None = None,
        inference_workers: int = 1,
        inference_resources: dict[str, float] | None = None,
        inference_options: dict[str, Any] | None = None,
        resume_from: Mapping[str, Any] | None = None,
        restore_envs: bool = False,
        **ray_only: Any,
    ):
        super().__init__()
        keywords = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self._closed = True  # nothing to release until the session opens
        self._last_count = 0
        self.settings = Settings.load()
        self.spec = CollectionSpec.from_keywords(self.settings, keywords)
        self.logger = check_logger(logger)
        _internals.check_version()
        checkpoint.check_resume(
            resume_from, restore_envs, frames_per_batch=frames_per_batch, sync=self.spec.batch.sync
        )
        # TorchRL-facing attributes.
        self.policy = policy
        self.frames_per_batch = self.requested_frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.collector_class = self.spec.inputs.collector_class
        self.replay_buffer, self.postproc, self.split_trajs = replay_buffer, postproc, split_trajs
        schemes = self.spec.weights.schemes
        _internals.set_weight_sync_schemes(self, None if schemes is None else dict(schemes))
        if self.spec.weights.updater is not None:
            self.weight_updater = self.spec.weights.updater  # BaseCollector registers us with it
        self._started = time.monotonic()
        self._background = BackgroundCollection(self._background_batches, self._finish_pass, "daskcollect")
        self._session = Session(
            self.spec, self.settings, policy, self.logger, owner=self, publish=self.publish_weights,
            refresh=self._refresh_weights, snapshot=self._snapshot,
            resumed_run=(resume_from or {}).get("run"),
        )  # fmt: skip
        self._progress = self._session.progress
        self._closed = False
        close_at_exit(self.shutdown)
        try:
            self._session.open()
            if seed is not None:
                self.set_seed(seed)
            if resume_from is not None:
                self.load_state_dict(resume_from, restore_envs=restore_envs)
            self._started = time.monotonic()
            self._session.reporter.report(self._snapshot, "ready", force=True)
        except BaseException:
            self.shutdown()
            raise

    # TorchRL's BaseCollector reads its counters from these (stats()).
    _frames = property(lambda self: self._progress.frames)
    _iter = property(lambda self: self._progress.iterations - 1)
    _engine = property(lambda self: self._session.engine)
    session = property(lambda self: self._session, doc="What this collection holds (a Session).")

    # --- properties -------------------------------------------------------
    @property
    def client(self):
        """The ``distributed.Client`` given as ``client=``; else daskcollect's own, which it closes at
        shutdown (``None`` once closed). daskcollect talks to the cluster through a ``Client`` of its
        own, with ``direct_to_workers=True``, even when given one: the user's stays as it was."""
        return self._session.client

    dashboard_link = property(
        lambda self: self._session.handle.dashboard_link if self._session.handle else None
    )

    @property
    def num_collectors(self) -> int:
        """The live collectors (follows the cluster when it grows or shrinks; the last count once shut down)."""
        if not self._closed and self._engine is not None:
            self._last_count = len(self._engine.pool.slots)
        return self._last_count

    num_workers = property(lambda self: self.num_collectors, doc="TorchRL's name for :attr:`num_collectors`.")

    @property
    def policy_version(self) -> int:
        """The version of the latest weights sent (0: those shipped at start)."""
        return self._engine.router.version if self._engine else 0

    @property
    def workers(self) -> list[str]:
        """The worker address of each collector, in collector order."""
        return [s.address for s in self._engine.pool.slots] if self._engine else []

    closed = property(lambda self: self._closed, doc="Whether :meth:`shutdown` ran.")

    def __len__(self) -> int:
        n = self.spec.batch.num_batches
        if n is None:
            raise EndlessCollectionError(
                "This collector is endless (total_frames=-1) and has no length. "
                "Pass total_frames=N to get len() == ceil(N / frames_per_batch)."
            )
        return n

    def __repr__(self) -> str:
        return display.describe(self)

    def _repr_html_(self) -> str:
        """Jupyter's view: mode, collectors, frames so far, and links to the dashboard and ``/daskcollect``."""
        return display.render_collector(self)

    # --- iteration ----------------------------------------------------------
    def __iter__(self) -> Iterator[TensorDictBase | None]:
        try:
            yield from super().__iter__()  # shuts down on Exception, as TorchRL does
        except KeyboardInterrupt:
            self.shutdown()
            raise

    def _check_open(self) -> None:
        """Raises what ended the background collection, or if the collector was shut down."""
        self._background.raise_error()
        if self._closed or self._engine is None:
            raise CollectorClosedError(
                "This DaskCollector was shut down. Build a new DaskCollector to collect again."
            )

    def _finish_pass(self) -> None:
        self._progress.finish(self._engine.pool.num_inflight)

    def iterator(self) -> Iterator[TensorDictBase | MemmapBatch | None]:
        self._check_open()
        if self._background.running:
            raise ConfigurationError(
                "This collector runs in the background (start()): read its replay buffer, or iterate "
                "inside `with collector.pause():`."
            )
        self._progress.begin(fresh=True)  # a resumed pass goes on with the batches it had left
        yield from self._batches()

    def _background_batches(self, fresh: bool) -> Iterator[None]:
        self._progress.begin(fresh)
        yield from self._batches(background=True)

    def _batches(self, background: bool = False) -> Iterator[TensorDictBase | MemmapBatch | None]:
        out = Output(self.spec.batch.sync, self._engine.ledger)

        def emit(rollouts: list) -> Any:
            return out.emit(rollouts, replay_buffer=self.replay_buffer, split_trajs=self.split_trajs,
                            postproc=self.postproc)  # fmt: skip

        report = functools.partial(self._session.reporter.report, self._snapshot)
        demand = None if background or not self.settings.scale_to_demand else self._session.demand
        yield from batches(self._engine, self._progress, self.settings.async_depth, emit, report, demand)

    # --- monitoring -------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: TorchRL's, plus losses, restarts and per-collector rates.

        Returns:
            ``frames``, ``batches``, (``total_frames``, ``completed``), ``policy_version``,
            ``frames_lost`` (of rollouts dropped whole), ``rollouts_lost``, ``restarts``
            (lost or stuck collectors replaced), ``env_restarts`` (``on_env_error="restart"``),
            ``retired`` (closed as their worker retired, losing nothing), ``live_collectors``,
            ``reattached`` (indices taken over from a dead driver, see ``resume_from``),
            ``worker_seconds``, ``worker_seconds_per_kframe`` (by resource class, see
            :mod:`daskcollect.monitoring.cost`), ``learner_fps``, ``wanted_collectors`` (:mod:`daskcollect.scaling`),
            ``inference`` (per server) and ``collectors``: per collector, the fields of
            :class:`~daskcollect.monitoring.stats.CollectorStats`.
        """
        out: dict[str, Any] = dict(super().stats())
        if self._engine is not None:
            out.update(self._engine.stats().as_dict())
            out["reattached"] = list(self._engine.adopted)
            out.update(self._session.cost_and_demand(out["frames"], out["collectors"]))
        if self._session.servers is not None:
            out["inference"] = self._session.servers.stats()
        return out

    def _snapshot(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self._started
        mode = "sync" if self.spec.batch.sync else "async"
        fps = self._progress.frames / elapsed if elapsed > 0 else 0.0
        return {**self.stats(), "mode": mode, "fps": fps, "time": time.time()}

    # --- seeds (state_dict and load_state_dict: CheckpointAPI) ------------------
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the collectors in order, then resets their envs.

        This is ``MultiSyncCollector.set_seed``: collector ``i`` seeds its envs
        with what collector ``i - 1``'s ``set_seed`` returned (and torch and
        NumPy with that seed); then every env is reset, so the next batch
        starts from seeded states.

        Returns:
            The seed returned by the last collector.
        """
        self._check_open()
        return self._engine.set_seed(seed, static_seed)

    # --- shutdown -----------------------------------------------------------
    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Closes what this collection opened, in reverse order; idempotent and bounded.

        A cluster given by the user stays up; only what this collector created goes.
        """
        if self._closed:
            return
        timeout = self.settings.timeouts.shutdown if timeout is None else timeout
        with contextlib.suppress(Exception):  # a stuck rollout: closing the actors ends it
            self._background.stop(timeout)
        self._last_count = self.num_collectors
        self._closed = True
        self._session.close(timeout)
        if raise_on_error:
            self._background.raise_error()  # what ended a background collection, if nothing did yet

    def __enter__(self) -> DaskCollector:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def __del__(self, _warn=warnings.warn, _finalizing=sys.is_finalizing):
        # Only warns. The defaults are bound now: at interpreter exit the modules'
        # globals may already be None, and a warning then has nowhere to go.
        if getattr(self, "_closed", True) is False and not _finalizing():
            _warn(
                f"DaskCollector at {id(self):#x} was not shut down; call shutdown() or use it as a "
                "context manager.",
                ResourceWarning,
                stacklevel=2,
            )
