"""``DaskCollector``: TorchRL's collector contract on Dask actors.

This module is the TorchRL face only: the keywords become a validated
:class:`~daskcollect.spec.CollectionSpec`, the spec goes to an
:class:`~daskcollect.engine.Engine` (the actors, the weights, the failure
policy), and iteration is one of the two strategies of
:mod:`daskcollect.iteration`:

- ``sync=True``: every collector gathers ``ceil(frames_per_batch / N)`` frames
  and the batch is their stack ``[N, ...]`` (TorchRL's ``MultiSyncCollector``
  with ``cat_results="stack"``).
- ``sync=False``: each batch is the ``frames_per_batch`` frames of whichever
  collector finished first; that collector is re-armed before the batch is
  yielded, so it keeps collecting while the driver trains.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from dask.system import CPU_COUNT
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import BaseCollector, Collector
from torchrl.collectors.utils import split_trajectories

from daskcollect import _internals, checkpoint, reattach, retirement
from daskcollect.background import BackgroundCollection
from daskcollect.cluster import (
    ClusterHandle,
    close_at_exit,
    connect,
    eligible_workers,
    share_cores,
    wait_for_workers,
)
from daskcollect.engine import Engine
from daskcollect.errors import CollectorClosedError, ConfigurationError, EndlessCollectionError
from daskcollect.inference.server import InferenceServers
from daskcollect.iteration import AsyncIteration, SyncIteration
from daskcollect.memmap import MemmapBatch, describe_parts
from daskcollect.monitoring import dashboard, display
from daskcollect.monitoring.reporter import Reporter, check_logger
from daskcollect.scheduler_plugins import Lease
from daskcollect.serialization import register_serializers
from daskcollect.settings import Settings
from daskcollect.spec import CollectionSpec
from daskcollect.weights.scheme import start_senders
from daskcollect.worker.plugin import WorkerSetup
from daskcollect.worker.rollout import Rollout

#: TorchRL collectors' default ``exploration_type``.
DEFAULT_EXPLORATION_TYPE = _internals.default_exploration_type()


class DaskCollector(BaseCollector):
    """Collects TorchRL rollouts on a Dask cluster, one long-lived actor per worker.

    The keyword names, defaults and meanings follow
    :class:`torchrl.collectors.distributed.RayCollector`, so code written for
    Ray runs with the class name changed.

    Args:
        create_env_fn: An env constructor (callable or ``EnvCreator``), an
            ``EnvBase`` instance (shipped pickled, with its state: transform
            statistics set on the driver arrive intact), or a list of them,
            one per collector.
        policy: The policy module, copied to every worker. ``None`` uses a
            random policy (or ``policy_factory``).

    Keyword Args:
        policy_factory: A callable (or one per collector) that builds the
            policy on the worker instead of shipping one.
        frames_per_batch: Frames per yielded batch.
        total_frames: Frames per pass over the collector; ``-1`` is endless.
        device: A device, or one per collector, as in TorchRL's collectors.
        storing_device: As ``device``, for the collected data.
        env_device: As ``device``, for the envs.
        policy_device: As ``device``, for the policy.
        max_frames_per_traj: Passed to each worker's TorchRL collector
            (``-1``: no limit); overrides ``collector_kwargs``, as in Ray.
        init_random_frames: Split over the collectors and passed to each
            worker's TorchRL collector; overrides ``collector_kwargs``.
        reset_at_each_iter: Passed to each worker's TorchRL collector;
            overrides ``collector_kwargs``.
        exploration_type: Passed to each worker's TorchRL collector;
            overrides ``collector_kwargs``.
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
        update_after_each_batch: Push the driver policy's weights after every
            batch.
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
        max_unreleased: The back-pressure bound: rollout folders on disk not
            yet released.
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
        self._closed = True  # nothing to release until the cluster is up
        self._handle: ClusterHandle | None = None
        self._driver_threads: int | None = None  # torch threads to restore at shutdown
        self._reporter: Reporter | None = None
        self._last_count = 0
        #: The engine (actors, weights, failure policy), private to this collector.
        self._engine: Engine | None = None
        #: The inference servers of ``inference="server"``, or ``None``.
        self._servers: InferenceServers | None = None
        self.settings = Settings.load()
        self.spec = CollectionSpec.from_keywords(self.settings, keywords)
        self.logger = check_logger(logger)
        _internals.check_version()
        if resume_from is not None:
            checkpoint.check(resume_from, frames_per_batch=frames_per_batch, sync=self.spec.batch.sync)
        elif restore_envs:
            raise ConfigurationError("restore_envs=True needs a checkpoint to restore: pass resume_from=.")
        self._resume_from = resume_from

        # TorchRL-facing attributes.
        self.policy = policy
        self.frames_per_batch = self.requested_frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.collector_class = self.spec.inputs.collector_class
        self.replay_buffer = replay_buffer
        self.postproc = postproc
        self.split_trajs = split_trajs
        schemes = self.spec.weights.schemes
        _internals.set_weight_sync_schemes(self, None if schemes is None else dict(schemes))
        if self.spec.weights.updater is not None:
            self.weight_updater = self.spec.weights.updater  # BaseCollector registers us with it
        self._frames = 0
        self._iter = -1
        self._pass_batches = self._resumed_pass = 0
        self._yielded = checkpoint.Yielded()
        self._pass_limit: int | None = None  # set to end the pass once the calls in flight are in
        self._started = time.monotonic()
        self._background = BackgroundCollection(self._background_batches, self._finish_pass, "daskcollect")

        self._leases: list[Lease] = []  # on the scheduler's shared plugins
        self._closed = False
        close_at_exit(self.shutdown)
        try:
            self._open()
            if seed is not None:
                self.set_seed(seed)
            if resume_from is not None:
                self.load_state_dict(resume_from, restore_envs=restore_envs)
            self._started = time.monotonic()
            self._reporter.report(self._snapshot, "ready", force=True)
        except BaseException:
            self.shutdown()
            raise

    def _open(self) -> None:
        """Connects, prepares the workers and starts the collectors."""
        spec, settings = self.spec, self.settings
        n = spec.num_collectors
        if n is None and spec.cluster.client is None and spec.cluster.scheduler_file is None:
            n = CPU_COUNT
        register_serializers()
        servers = spec.inference.workers if spec.inference is not None else 0
        self._handle = connect(spec.cluster, n_workers=(n or 1) + servers, settings=settings)
        client = self._handle.client
        report_id = f"{socket.gethostname()}-{os.getpid()}-{id(self) & 0xFFFFFF:06x}"
        self._reporter = Reporter(
            client, report_id, settings.report_interval, settings.timeouts.call, self.logger
        )
        setup = WorkerSetup(spec.cluster.worker_env, settings.worker)
        self._handle.register_plugin(setup, name=f"daskcollect-{uuid.uuid4().hex[:12]}")
        leases = (
            retirement.install_retirement_hook(client, settings.timeouts.retire),
            dashboard.install_monitor(client, settings.history, settings.timeouts.call),
        )
        self._leases = [held for held in leases if held is not None]
        if spec.inference is not None:
            self._servers = InferenceServers(client, settings, spec.inference, self.policy)
            self._servers.start()
        reserved = self._servers.addresses if self._servers is not None else set()
        if n is None:
            resources = spec.cluster.worker_resources
            wait_for_workers(client, 1 + len(reserved), resources, settings.timeouts.workers)
            n = len(set(eligible_workers(client, resources, settings.timeouts.connect)) - reserved)
        if spec.num_collectors is None:  # a count known before connecting was checked then
            spec.check_count(n)
        recipes = spec.recipes(n, self._servers.policies(n) if self._servers is not None else None)
        module = self.policy if isinstance(self.policy, torch.nn.Module) else None
        held, run, claimed = reattach.hold(self._handle, settings, (self._resume_from or {}).get("run"))
        self._leases += [held] if held is not None else []
        self._engine = Engine(client, spec, settings, n, recipes, module, push=self._refresh_weights, run=run)
        self._engine.serve_from(self._servers)
        start_senders(self.spec.weights.schemes, self, self._publish)
        if claimed is not None:
            self._engine.adopt(list(claimed.members))
        else:
            self._engine.start()
        self._driver_threads = share_cores(self.settings.driver_torch_threads, self._engine, self._handle)

    # --- properties -------------------------------------------------------
    @property
    def client(self):
        """The ``distributed.Client`` given as ``client=``; else daskcollect's own, which it closes at
        shutdown (``None`` once closed). daskcollect talks to the cluster through a ``Client`` of its
        own, with ``direct_to_workers=True``, even when given one: the user's stays as it was."""
        if self._handle is None:
            return None
        return self._handle.given or self._handle.client

    @property
    def dashboard_link(self) -> str | None:
        return self._handle.dashboard_link if self._handle else None

    @property
    def num_collectors(self) -> int:
        """The live collectors (follows the cluster when it grows or shrinks; the last count once shut down)."""
        if self._closed or self._engine is None:
            return self._last_count
        self._last_count = len(self._engine.pool.slots)
        return self._last_count

    @property
    def num_workers(self) -> int:
        """TorchRL's name for :attr:`num_collectors` (each collector is one TorchRL worker)."""
        return self.num_collectors

    @property
    def policy_version(self) -> int:
        """The version of the latest weights sent (0: those shipped at start)."""
        return self._engine.router.version if self._engine else 0

    @property
    def workers(self) -> list[str]:
        """The worker address of each collector, in collector order."""
        return [s.address for s in self._engine.pool.slots] if self._engine else []

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` ran."""
        return self._closed

    def __len__(self) -> int:
        n = self.spec.batch.num_batches
        if n is None:
            raise EndlessCollectionError(
                "This collector is endless (total_frames=-1) and has no length. "
                "Pass total_frames=N to get len() == ceil(N / frames_per_batch)."
            )
        return n

    def __repr__(self) -> str:
        mode = "sync" if self.spec.batch.sync else "async"
        state = "closed" if self._closed else "open"
        return (
            f"DaskCollector(num_collectors={self.num_collectors}, {mode}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, {state})"
        )

    def _repr_html_(self) -> str:
        """Jupyter's view: mode, collectors, frames so far, and links to the dashboard and ``/daskcollect``."""
        client = self.client
        summary = {
            "mode": "sync" if self.spec.batch.sync else "async",
            "state": "closed" if self._closed else "open",
            "frames_per_batch": self.frames_per_batch,
            "dashboard": self.dashboard_link,
            "scheduler": getattr(getattr(client, "scheduler", None), "address", None),
        }
        return display.render(summary, self.stats())

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

    def _remaining(self) -> int | None:
        n = self.spec.batch.num_batches
        left = [x - self._pass_batches for x in (n, self._pass_limit) if x is not None]
        return min(left) if left else None

    def _finish_pass(self) -> None:
        """Ends the pass once the rollouts in flight are in (they are yielded, nothing is lost)."""
        self._pass_limit = self._pass_batches + self._engine.pool.num_inflight

    def iterator(self) -> Iterator[TensorDictBase | MemmapBatch | None]:
        self._check_open()
        if self._background.running:
            raise ConfigurationError(
                "This collector runs in the background (start()): read its replay buffer, or iterate "
                "inside `with collector.pause():`."
            )
        # A resumed pass goes on from the checkpointed one: only the batches it had left.
        self._pass_batches, self._pass_limit, self._resumed_pass = self._resumed_pass, None, 0
        yield from self._batches()

    def _background_batches(self, fresh: bool) -> Iterator[None]:
        if fresh:
            self._pass_batches = 0
        self._pass_limit = None
        yield from self._batches()

    def _batches(self) -> Iterator[TensorDictBase | MemmapBatch | None]:
        if self.spec.batch.sync:
            source = SyncIteration(self._engine, self._remaining)
        else:
            source = AsyncIteration(
                self._engine, self._remaining, self.settings.async_depth, self.spec.weights.max_policy_lag
            )
        for rollouts in source:
            self._iter += 1
            self._pass_batches += 1
            self._frames += sum(r.frames for r in rollouts)
            self._reporter.report(self._snapshot)
            yield self._emit(rollouts)

    def _emit(self, rollouts: list[Rollout]) -> TensorDictBase | MemmapBatch | None:
        """Turns one batch's rollouts (in collector order) into what the iterator yields."""
        self._yielded.record(rollouts)
        sync, rb, ledger = self.spec.batch.sync, self.replay_buffer, self._engine.ledger
        if ledger is not None:
            shape = rollouts[0].batch_size
            size = torch.Size([len(rollouts), *shape]) if sync else shape
            handle = ledger.track(MemmapBatch(batch_size=size, **describe_parts(rollouts)))
            if rb is None:
                return handle
            for path in handle.paths:  # extend from the memory map: no copy into RAM first
                rb.extend(TensorDict.load_memmap(path))
            handle.release()
            return None
        if rollouts[0].batch is None:
            return None  # the collectors extended the cluster's replay buffer themselves
        batch = torch.stack([r.batch for r in rollouts], 0) if sync else rollouts[0].batch
        if self.split_trajs:
            batch = split_trajectories(batch)
        if self.postproc is not None:
            batch = self.postproc(batch)
        if rb is not None:
            rb.extend(batch.reshape(-1) if batch.ndim > 1 else batch)
            return None
        return batch

    # --- background collection --------------------------------------------
    def start(self) -> None:
        """Collects in the background into ``replay_buffer=`` until ``total_frames`` or :meth:`shutdown`.

        Returns at once. An error in the background is raised at the next call
        on the collector.

        Raises:
            ConfigurationError: Without a replay buffer.
        """
        self._check_open()
        if self.replay_buffer is None:
            raise ConfigurationError(
                "start() collects in the background into a replay buffer: pass replay_buffer= (a "
                "torchrl.data.ReplayBuffer) to DaskCollector, or iterate over the collector instead."
            )
        self._background.start()

    @property
    def collecting_in_background(self) -> bool:
        """Whether a :meth:`start` is collecting now (``False`` once ``total_frames`` are in, or after an error)."""
        return self._background.running

    @contextlib.contextmanager
    def pause(self, timeout: float | None = None, *, resume: bool = True) -> Iterator[None]:
        """Stops background writes once the rollouts in flight are in; resumes on exit.

        Args:
            timeout: Bound on waiting for the rollouts in flight, in seconds
                (default ``daskcollect.timeouts.rollout``).
            resume: Resume the background collection when the block exits.
        """
        self._check_open()
        timeout = self.settings.timeouts.rollout if timeout is None else timeout
        with self._background.pause(timeout, resume=resume):
            yield

    # --- monitoring -------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: TorchRL's, plus losses, restarts and per-collector rates.

        Returns:
            ``frames``, ``batches``, (``total_frames``, ``completed``), ``policy_version``,
            ``frames_lost`` (frames of rollouts dropped whole), ``rollouts_lost``,
            ``restarts`` (collectors replaced after a lost worker or a stuck
            rollout), ``env_restarts`` (``on_env_error="restart"`` rebuilds),
            ``retired`` (collectors closed, losing nothing, as their worker retired),
            ``live_collectors``, ``reattached`` (the indices of the collectors
            taken over from a driver that died, see ``resume_from``), and
            ``collectors``: per collector, the fields of
            :class:`~daskcollect.monitoring.stats.CollectorStats`.
        """
        out: dict[str, Any] = dict(super().stats())
        if self._engine is not None:
            out.update(self._engine.stats().as_dict())
            out["reattached"] = list(self._engine.adopted)
        if self._servers is not None:
            out["inference"] = self._servers.stats()
        return out

    def _snapshot(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self._started
        return {
            **self.stats(),
            "mode": "sync" if self.spec.batch.sync else "async",
            "fps": self._frames / elapsed if elapsed > 0 else 0.0,
            "time": time.time(),
        }

    # --- weights ------------------------------------------------------------
    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: int | Sequence[int] | None = None,
        **kwargs: Any,
    ) -> None:
        """Sends new policy weights to the collectors through ``weight_sync_schemes`` or ``weight_updater``.

        With the default :class:`~daskcollect.DaskWeightSyncScheme`, collectors
        on the driver's host read the weights from one shared-memory file
        written once; collectors on other hosts get one Dask scatter,
        replicated between their workers. Each collector loads them in place
        before its next rollout (a rollout already running finishes on the
        weights it started with).

        Args:
            policy_or_weights: An ``nn.Module``, a TensorDict of weights or a
                dict of tensors. Defaults to the driver's ``policy``.
            weights: Keyword form for weights.
            policy: Keyword form for a module.
            worker_ids: A collector index or a list of them; default all.
            **kwargs: TorchRL's ``model_id`` / ``weights_dict``; the only model is ``"policy"``.

        Raises:
            ConfigurationError: If there are no weights to send, they do not
                fit the policy, or the arguments conflict.
        """
        self._check_open()
        given = [x for x in (policy_or_weights, weights, policy) if x is not None]
        if len(given) > 1:
            raise ConfigurationError("Pass weights once: positionally, as weights= or as policy=.")
        weights_dict = kwargs.pop("weights_dict", None)
        models = set(weights_dict or ()) | {kwargs.pop("model_id", None) or "policy"}
        if models != {"policy"}:
            raise ConfigurationError(
                f"DaskCollector syncs one model, 'policy'; got {sorted(models)}. Pass the policy's "
                "weights without weights_dict or model_id."
            )
        source = given[0] if given else (weights_dict or {}).get("policy")
        super().update_policy_weights_(source, worker_ids=worker_ids, **kwargs)

    def _publish(self, weights: Any, worker_ids: list[int] | None) -> None:
        """Writes ``weights`` once per route as a new version for ``worker_ids`` (``None``: all)."""
        self._check_open()
        self._engine.send_weights(weights, self._engine.select(worker_ids))

    def _collector_indices(self) -> list[int]:
        return [slot.index for slot in self._engine.select(None)]

    def _refresh_weights(self, slots: list) -> None:
        """``update_after_each_batch`` / ``max_weight_update_interval``: the driver's policy to ``slots``."""
        self.update_policy_weights_(self.policy, worker_ids=[slot.index for slot in slots])

    # --- seeds and state ----------------------------------------------------
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

    def state_dict(self) -> OrderedDict:
        """A checkpoint: the driver's counters and, for each collector, where it stood after the
        last rollout yielded (:mod:`daskcollect.checkpoint`).

        Save it with ``torch.save`` next to your model; :meth:`load_state_dict`
        on a new ``DaskCollector`` continues the run.
        """
        self._check_open()
        counters = {
            "frames": self._frames,
            "iterations": self._iter + 1,
            "pass_batches": self._pass_batches,
            "frames_per_batch": self.frames_per_batch,
            "total_frames": self.total_frames,
            "sync": self.spec.batch.sync,
        }
        return checkpoint.take(self._engine, self._yielded, counters, self.settings.timeouts.call)

    def load_state_dict(
        self, state_dict: OrderedDict | Sequence[dict], *, restore_envs: bool = False
    ) -> None:
        """Continues the collection checkpointed by :meth:`state_dict` (call it before iterating).

        Args:
            state_dict: A checkpoint, or (as for ``RayCollector``) a list of
                TorchRL state dicts, one per collector, loaded into each.
            restore_envs: Continue every trajectory where it stood, value for
                value. Only for stateless envs (whose state is their
                tensordict, as TorchRL's ``PendulumEnv``); with ``False`` each
                collector starts new trajectories from its restored
                random-number generators.

        Raises:
            ConfigurationError: If the checkpoint does not fit this collector.
        """
        self._check_open()
        if isinstance(state_dict, (list, tuple)):
            checkpoint.load_torchrl_states(self._engine, list(state_dict), self.settings.timeouts.call)
            return
        checkpoint.check(state_dict, frames_per_batch=self.frames_per_batch, sync=self.spec.batch.sync)
        self._engine.pool.drain(self.settings.timeouts.rollout)  # nothing collected before may be yielded
        checkpoint.resume(self._engine, self._yielded, state_dict, restore_envs, self.settings.timeouts.call)
        self._frames = state_dict["frames"]
        self._iter = state_dict["iterations"] - 1
        self._resumed_pass = state_dict["pass_batches"]

    # --- shutdown -----------------------------------------------------------
    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Closes our actors and plugin, and a private cluster; idempotent and bounded.

        A cluster given by the user stays up; only what this collector created goes.
        """
        if self._closed:
            return
        timeout = self.settings.timeouts.shutdown if timeout is None else timeout
        with contextlib.suppress(Exception):  # a stuck rollout: closing the actors ends it
            self._background.stop(timeout)
        self._closed = True
        if self._engine is not None:
            self._last_count = len(self._engine.pool.slots)
            if self._reporter is not None:
                self._reporter.close(self._snapshot)
            self._engine.close(timeout)
        if self._servers is not None:
            self._servers.close(timeout)
        for scheme in (self.spec.weights.schemes or {}).values():
            scheme.shutdown()
        for held in self._leases:  # the last collection on the scheduler removes the plugins
            held.release()
        self._leases = []
        if self._driver_threads is not None:
            torch.set_num_threads(self._driver_threads)
            self._driver_threads = None
        if self._handle is not None:
            self._handle.close(timeout)
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
