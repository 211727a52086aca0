"""``DaskCollector``: TorchRL's collector contract on Dask actors.

The driver keeps one :class:`~daskcollect.actor.CollectorActor` per worker
process, scatters the policy weights once per update, and feeds the iterator
with rollouts in completion order (see :class:`~daskcollect.pool.ActorPool`):

- ``sync=True``: every collector gathers ``ceil(frames_per_batch / N)`` frames
  and the batch is their stack ``[N, ...]`` (TorchRL's ``MultiSyncCollector``
  with ``cat_results="stack"``).
- ``sync=False``: each batch is the ``frames_per_batch`` frames of whichever
  collector finished first; that collector is re-armed before the batch is
  yielded, so it keeps collecting while the driver trains.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from dask.system import CPU_COUNT
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import BaseCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.collectors._constants import DEFAULT_EXPLORATION_TYPE
from torchrl.collectors.utils import split_trajectories

from daskcollect import config, dashboard, retirement
from daskcollect.actor import ActorSpec, Rollout
from daskcollect.cluster import ClusterHandle, connect, eligible_workers, live_workers, wait_for_workers
from daskcollect.errors import (
    CollectorClosedError,
    ConfigurationError,
    EndlessCollectionError,
    NotEnoughWorkersError,
)
from daskcollect.memmap import MemmapBatch, MemmapLedger, describe_parts
from daskcollect.options import BatchOptions, ClusterOptions, FaultOptions, OutputOptions, WeightOptions
from daskcollect.plugin import WorkerSetup
from daskcollect.pool import ActorPool, CollectorLost, Slot
from daskcollect.recipe import CollectorRecipe
from daskcollect.stats import FailureCounters
from daskcollect.weights import WeightsPayload, extract_weights

logger = logging.getLogger(__name__)

_COLLECTOR_ALIASES = {"single": Collector, "sync": MultiSyncCollector, "async": MultiAsyncCollector}
# RayCollector keywords that have no meaning on Dask; accepted so that code
# written for Ray runs unchanged, and ignored with a warning.
_RAY_ONLY = (
    "ray_init_config",
    "remote_configs",
    "weight_updater",
    "weight_sync_schemes",
    "weight_recv_schemes",
)


def _per_collector(value: Any, name: str, n: int) -> list:
    """Broadcasts ``value`` to ``n`` collectors, or checks a list's length."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ConfigurationError(
                f"{name} is a list of length {len(value)} but there are {n} collectors. "
                f"Pass one {name} per collector, or a single value for all."
            )
        return list(value)
    return [value] * n


def _check_replay_buffer(replay_buffer: Any, memmap: bool) -> None:
    if replay_buffer is None:
        return
    if not callable(getattr(replay_buffer, "extend", None)):
        raise ConfigurationError(
            f"replay_buffer must be a torchrl.data.ReplayBuffer (with .extend), got "
            f"{type(replay_buffer).__name__}."
        )
    storage = getattr(replay_buffer, "_storage", None)
    if memmap and type(storage).__name__ == "ListStorage":
        raise ConfigurationError(
            "A ListStorage keeps references to the memory-mapped batches, whose files are deleted "
            "once the buffer is extended. Use LazyTensorStorage or LazyMemmapStorage with "
            "output='memmap'."
        )


def _resolve_collector_class(collector_class: Any) -> type:
    if isinstance(collector_class, str):
        try:
            return _COLLECTOR_ALIASES[collector_class]
        except KeyError:
            raise ConfigurationError(
                f"collector_class={collector_class!r} is unknown. Use 'single', 'sync', "
                "'async' or a torchrl.collectors.BaseCollector subclass."
            ) from None
    if isinstance(collector_class, type) and issubclass(collector_class, BaseCollector):
        return collector_class
    raise ConfigurationError(
        f"collector_class must be a torchrl.collectors.BaseCollector subclass or one of "
        f"'single', 'sync', 'async', got {collector_class!r}."
    )


class DaskCollector(BaseCollector):
    """Collects TorchRL rollouts on a Dask cluster, one long-lived actor per worker.

    The keyword names, defaults and meanings follow
    :class:`torchrl.collectors.distributed.RayCollector`, so code written for
    Ray runs with the class name changed.

    Args:
        create_env_fn: An env constructor (callable or ``EnvCreator``), or a
            list of them, one per collector.
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
        max_frames_per_traj: Passed to each worker's TorchRL collector.
        init_random_frames: Passed to each worker's TorchRL collector, split
            over the collectors.
        reset_at_each_iter: Passed to each worker's TorchRL collector.
        exploration_type: Passed to each worker's TorchRL collector.
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
            ``"policy_version"`` in every frame.
        client: A ``distributed.Client``, a scheduler address, or ``None`` for
            a private loopback ``LocalCluster`` closed at shutdown.
        scheduler_file: A scheduler file, instead of ``client``.
        worker_env: Environment variables set on each worker, with no restart,
            before any env or policy is built.
        worker_resources: Resources a worker must declare to host a
            collector, e.g. ``{"GPU": 1}``.
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
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
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
        client: Any = None,
        scheduler_file: str | None = None,
        worker_env: dict[str, str] | None = None,
        worker_resources: dict[str, float] | None = None,
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
        **ray_only: Any,
    ):
        super().__init__()
        self._closed = True  # nothing to release until the cluster is up
        self._handle: ClusterHandle | None = None
        self._driver_threads: int | None = None  # torch threads to restore at shutdown
        self._pool: ActorPool | None = None
        self._plugin_name: str | None = None
        self._ledger: MemmapLedger | None = None

        unknown = set(ray_only) - set(_RAY_ONLY)
        if unknown:
            raise TypeError(f"DaskCollector got unexpected keyword arguments {sorted(unknown)}")
        for name, value in ray_only.items():
            if value is not None:
                warnings.warn(f"{name} is specific to Ray and is ignored by DaskCollector.", stacklevel=2)

        self.batch_options = BatchOptions(frames_per_batch, total_frames, bool(sync), split_trajs, postproc)
        self.weight_options = WeightOptions(
            update_after_each_batch, max_weight_update_interval, bool(track_policy_version)
        )
        self.cluster_options = ClusterOptions(
            client, scheduler_file, worker_env or {}, worker_resources, security
        )
        if max_unreleased is None:
            max_unreleased = int(config.get("memmap.max-unreleased"))
        self.output_options = OutputOptions(
            output, memmap_dir, memmap_retention, max_unreleased, replay_buffer
        )
        if self.output_options.memmap and (postproc is not None or split_trajs):
            raise ConfigurationError(
                "postproc and split_trajs need the data on the driver; with output='memmap' apply "
                "them to batch.load() yourself."
            )
        _check_replay_buffer(replay_buffer, self.output_options.memmap)
        if max_collector_restarts is None:
            max_collector_restarts = int(config.get("max-collector-restarts"))
        self.fault_options = FaultOptions(max_collector_restarts, on_env_error)
        collector_class = _resolve_collector_class(collector_class)
        if not isinstance(num_workers_per_collector, int) or num_workers_per_collector < 1:
            raise ConfigurationError(
                f"num_workers_per_collector must be an int >= 1, got {num_workers_per_collector!r}."
            )
        if num_collectors not in (None, "auto") and (
            not isinstance(num_collectors, int) or num_collectors < 1
        ):
            raise ConfigurationError(f"num_collectors must be an int >= 1 or 'auto', got {num_collectors!r}.")
        # Follow the cluster: a worker that joins gets a collector.
        self._follow = not isinstance(create_env_fn, (list, tuple)) and (
            num_collectors == "auto"
            or (num_collectors is None and (client is not None or scheduler_file is not None))
        )
        if num_collectors == "auto":
            if isinstance(create_env_fn, (list, tuple)):
                raise ConfigurationError(
                    "num_collectors='auto' needs a single create_env_fn (every new worker runs it); "
                    "pass one constructor, or a fixed num_collectors."
                )
            num_collectors = None
        if isinstance(create_env_fn, (list, tuple)):
            if num_collectors is not None and num_collectors != len(create_env_fn):
                raise ConfigurationError(
                    f"create_env_fn is a list of length {len(create_env_fn)} but "
                    f"num_collectors={num_collectors}. Pass one env constructor per collector, "
                    "or leave num_collectors unset."
                )
            num_collectors = len(create_env_fn)
        elif not callable(create_env_fn):
            raise ConfigurationError(
                f"create_env_fn must be a callable returning an env (or a list of them), got "
                f"{type(create_env_fn).__name__}. Pass e.g. lambda: GymEnv('CartPole-v1')."
            )

        # TorchRL-facing attributes.
        self.policy = policy
        self.frames_per_batch = self.requested_frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.collector_class = collector_class
        self.replay_buffer = replay_buffer
        self.postproc = postproc
        self.split_trajs = split_trajs
        self._frames = 0
        self._iter = -1
        self._policy_version = 0
        self._pass_batches = 0
        self._seed: int | None = None
        self._known_workers: set[str] = set()
        self._report_id = f"{socket.gethostname()}-{os.getpid()}-{id(self) & 0xFFFFFF:06x}"
        self._next_report = 0.0
        self._started = time.monotonic()
        self._failures = FailureCounters()

        if num_collectors is None and client is None and scheduler_file is None:
            num_collectors = CPU_COUNT
        self._closed = False
        try:
            self._handle = connect(self.cluster_options, n_workers=num_collectors or 1)
            client_ = self._handle.client
            if num_collectors is None:
                wait_for_workers(client_, 1, worker_resources, config.timeout("workers"))
                num_collectors = len(eligible_workers(client_, worker_resources))
            self.num_collectors = self._requested = num_collectors
            if self.output_options.memmap and sync and max_unreleased < num_collectors:
                raise ConfigurationError(
                    f"max_unreleased={max_unreleased} is below num_collectors={num_collectors}: a sync "
                    "batch holds one rollout folder per collector. Raise max_unreleased."
                )
            recipes = self._recipes(
                create_env_fn,
                policy,
                policy_factory,
                collector_class,
                collector_kwargs,
                num_workers_per_collector,
                dict(
                    device=device,
                    storing_device=storing_device,
                    env_device=env_device,
                    policy_device=policy_device,
                ),
                dict(
                    max_frames_per_traj=max_frames_per_traj,
                    init_random_frames=(init_random_frames // num_collectors) if init_random_frames else None,
                    reset_at_each_iter=reset_at_each_iter,
                    exploration_type=exploration_type,
                    trust_policy=trust_policy,
                    use_env_creator=use_env_creator or None,
                    no_cuda_sync=no_cuda_sync,
                    trajs_per_batch=trajs_per_batch,
                    pre_collect_hook=pre_collect_hook,
                    post_collect_hook=post_collect_hook,
                ),
            )
            self._plugin_name = f"daskcollect-{id(self):x}"
            client_.register_plugin(
                WorkerSetup(
                    self.cluster_options.worker_env,
                    config.get("worker.torch-threads"),
                    config.get("worker.trim-sys-path"),
                    config.seconds("worker.tick-interval"),
                ),
                name=self._plugin_name,
            )
            retirement.register(client_)
            dashboard.register(client_)
            addresses = wait_for_workers(client_, num_collectors, worker_resources, config.timeout("workers"))
            if self.output_options.memmap:
                options = self.output_options
                self._ledger = MemmapLedger(
                    options.memmap_dir, options.memmap_retention, options.max_unreleased
                )
            spec = ActorSpec(
                0,
                0,
                self.weight_options.track_policy_version,
                self._ledger.root if self._ledger else None,
                self.fault_options.on_env_error == "restart",
            )
            self._pool = ActorPool(client_, spec, worker_resources)
            self._pool.start(recipes, addresses[:num_collectors])
            self._share_cores()
            if seed is not None:
                self.set_seed(seed)
            self._started = time.monotonic()
            self._report("ready", force=True)
        except BaseException:
            self.shutdown()
            raise

    # --- construction helpers ---------------------------------------------
    def _share_cores(self) -> None:
        """Leaves the cores of collectors on this host to them, as TorchRL's multiprocess collectors do.

        With ``daskcollect.driver.torch-threads: auto``, the driver's torch
        threads become the cores less the collectors on this host (at least 1)
        until shutdown: a learner's thread pool on cores busy with rollouts
        spins and slows down (DQN's gradient steps ran 2-3 times slower).
        """
        setting = config.get("driver.torch-threads")
        if setting is None:
            return
        if setting == "auto":
            if self._pool.shares_memory:
                here = sum(s.local for s in self._pool.slots)
            else:  # no probe: only a private cluster is known to be on this host
                here = len(self._pool.slots) if self._handle.cluster is not None else 0
            if not here:
                return
            threads = max(1, torch.get_num_threads() - here)
        else:
            threads = int(setting)
        self._driver_threads = torch.get_num_threads()
        torch.set_num_threads(threads)

    def _recipes(
        self,
        create_env_fn,
        policy,
        policy_factory,
        collector_class,
        collector_kwargs,
        num_envs,
        devices: dict,
        shared: dict,
    ) -> list[bytes]:
        n = self.num_collectors
        envs = _per_collector(create_env_fn, "create_env_fn", n)
        factories = _per_collector(policy_factory, "policy_factory", n)
        user_kwargs = _per_collector(collector_kwargs or {}, "collector_kwargs", n)
        per_device = {k: _per_collector(v, k, n) for k, v in devices.items()}
        fpc = self.batch_options.frames_per_collector(n)
        blobs: list[tuple[CollectorRecipe, bytes]] = []
        out = []
        for i in range(n):
            kwargs = {k: v for k, v in shared.items() if v is not None}
            kwargs.update({k: v[i] for k, v in per_device.items() if v[i] is not None})
            kwargs.update(user_kwargs[i])
            kwargs["frames_per_batch"] = fpc
            kwargs["split_trajs"] = False  # split on the driver, after stacking
            if kwargs.pop("use_env_creator", None):
                from torchrl.envs import EnvCreator

                envs[i] = envs[i] if isinstance(envs[i], EnvCreator) else EnvCreator(envs[i])
            recipe = CollectorRecipe(envs[i], policy, factories[i], collector_class, kwargs, num_envs)
            # Identical recipes (the usual case) are pickled once.
            blob = next((b for r, b in blobs if r == recipe), None)
            if blob is None:
                blob = recipe.dumps()
                blobs.append((recipe, blob))
            out.append(blob)
        return out

    # --- properties -------------------------------------------------------
    @property
    def client(self):
        """Our ``distributed.Client`` (``direct_to_workers=True``)."""
        return self._handle.client if self._handle else None

    @property
    def dashboard_link(self) -> str | None:
        return self._handle.dashboard_link if self._handle else None

    @property
    def num_workers(self) -> int:
        return self.num_collectors

    @property
    def policy_version(self) -> int:
        """The version of the latest weights sent (0: those shipped at start)."""
        return self._policy_version

    @property
    def workers(self) -> list[str]:
        """The worker address of each collector, in collector order."""
        return [s.address for s in self._pool.slots] if self._pool else []

    def __len__(self) -> int:
        n = self.batch_options.num_batches
        if n is None:
            raise EndlessCollectionError(
                "This collector is endless (total_frames=-1) and has no length. "
                "Pass total_frames=N to get len() == ceil(N / frames_per_batch)."
            )
        return n

    def __repr__(self) -> str:
        mode = "sync" if self.batch_options.sync else "async"
        state = "closed" if self._closed else "open"
        return (
            f"DaskCollector(num_collectors={getattr(self, 'num_collectors', '?')}, {mode}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, {state})"
        )

    # --- iteration ----------------------------------------------------------
    def __iter__(self) -> Iterator[TensorDictBase | None]:
        try:
            yield from super().__iter__()  # shuts down on Exception, as TorchRL does
        except KeyboardInterrupt:
            self.shutdown()
            raise

    def _check_open(self) -> None:
        if self._closed or self._pool is None:
            raise CollectorClosedError(
                "This DaskCollector was shut down. Build a new DaskCollector to collect again."
            )

    def iterator(self) -> Iterator[TensorDictBase | MemmapBatch | None]:
        self._check_open()
        self._pass_batches = 0
        source = self._sync_rollouts() if self.batch_options.sync else self._async_rollouts()
        for rollouts in source:
            self._iter += 1
            self._pass_batches += 1
            self._frames += sum(r.frames for r in rollouts)
            self._report()
            yield self._emit(rollouts)

    def _emit(self, rollouts: list[Rollout]) -> TensorDictBase | MemmapBatch | None:
        """Turns one batch's rollouts (in collector order) into what the iterator yields."""
        sync, rb = self.batch_options.sync, self.replay_buffer
        if self._ledger is not None:
            shape = rollouts[0].batch_size
            handle = self._ledger.track(
                MemmapBatch(
                    batch_size=torch.Size([len(rollouts), *shape]) if sync else shape,
                    **describe_parts(rollouts),
                )  # fmt: skip
            )
            if rb is None:
                return handle
            for path in handle.paths:  # extend from the memory map: no copy into RAM first
                rb.extend(TensorDict.load_memmap(path))
            handle.release()
            return None
        batch = torch.stack([r.batch for r in rollouts], 0) if sync else rollouts[0].batch
        if self.split_trajs:
            batch = split_trajectories(batch)
        if self.postproc is not None:
            batch = self.postproc(batch)
        if rb is not None:
            rb.extend(batch.reshape(-1) if batch.ndim > 1 else batch)
            return None
        return batch

    def _remaining(self) -> int | None:
        n = self.batch_options.num_batches
        return None if n is None else n - self._pass_batches

    def _wait_for_room(self, needed: int) -> None:
        """Back-pressure of memmap output: no rollout starts beyond ``max_unreleased``."""
        if self._ledger is not None:
            self._ledger.wait_for_room(needed, self._pool.num_inflight, config.timeout("rollout"))

    def _sync_rollouts(self) -> Iterator[list[Rollout]]:
        pool = self._pool
        timeout = config.timeout("rollout")
        while self._remaining() is None or self._remaining() > 0:
            self._settle_retired(wait=True)
            self._maybe_grow()
            self._refresh_weights(pool.slots)
            self._wait_for_room(len(pool.slots))
            # A collector whose worker is retiring takes no call (submit returns False).
            expected = {s.index for s in list(pool.slots) if pool.submit_rollout(s)}
            results: dict[int, Rollout] = {}
            while expected - results.keys():
                try:
                    rollout = pool.next_rollout(timeout)
                except CollectorLost as lost:
                    # Keep the batch shape: the replacement re-collects the lost share.
                    replacement = self._recover(lost)
                    if replacement is None or not pool.submit_rollout(replacement):
                        expected.discard(lost.slot.index)
                    continue
                if self._env_failed(rollout):
                    slot = pool.slot(rollout.index)
                    if slot is None or not pool.submit_rollout(slot):
                        expected.discard(rollout.index)
                    continue
                results[rollout.index] = rollout
            if results:
                yield [results[i] for i in sorted(results)]

    def _async_rollouts(self) -> Iterator[list[Rollout]]:
        pool = self._pool
        timeout = config.timeout("rollout")
        depth = max(int(config.get("async-depth")), 1)
        ledger = self._ledger

        def arm(slots: list[Slot], held: int) -> None:
            # Keep `depth` calls queued on each collector (round robin), but no
            # more calls in flight than the pass still needs, nor than memmap
            # back-pressure allows.
            for _ in range(depth):
                for slot in slots:
                    remaining = self._remaining()
                    if remaining is not None and pool.num_inflight >= remaining - held:
                        return
                    if ledger is not None and ledger.room(pool.num_inflight + held) <= 0:
                        return
                    if pool.inflight_count(slot) < depth:
                        pool.submit_rollout(slot)

        self._refresh_weights([s for s in pool.slots if not pool.inflight_count(s)])
        while True:
            self._settle_retired(wait=False)
            arm(pool.slots, held=0)
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                return
            if not pool.num_inflight:
                self._wait_for_room(1)  # every rollout is held by the caller: wait for releases
                continue
            try:
                rollout = pool.next_rollout(timeout)
            except CollectorLost as lost:
                self._recover(lost)  # the loop re-arms the replacement
                continue
            if self._env_failed(rollout):
                continue
            # Re-arm before yielding, so the collector works while the driver trains.
            slot = pool.slot(rollout.index)
            if slot is not None and not slot.retiring:
                self._refresh_weights([slot])
                arm([slot], held=1)
            yield [rollout]
            self._maybe_grow()

    def _maybe_grow(self) -> None:
        """Starts collectors on free workers: every one that joined in follow mode,
        and in fixed mode those that bring the count back to ``num_collectors``.

        With no collector left (every worker retired or lost), waits (bounded by
        ``daskcollect.timeouts.workers``) for a worker to join.

        Raises:
            NotEnoughWorkersError: If no collector can be started in that time.
        """
        self._grow_once()
        timeout = config.timeout("workers")
        deadline = time.monotonic() + timeout
        while not self._pool.slots:
            if time.monotonic() > deadline:
                raise NotEnoughWorkersError(
                    f"Every collector's worker left and no eligible worker joined within {timeout:g}s. "
                    "Add workers, or raise daskcollect.timeouts.workers.",
                    needed=1,
                    found=0,
                )
            time.sleep(0.2)
            self._known_workers = set()  # look again
            self._grow_once()

    def _grow_once(self) -> None:
        pool = self._pool
        if self._follow:
            alive = live_workers(self.client)  # one light RPC per batch
            if alive <= self._known_workers:
                return
            self._known_workers = alive
            new = pool.grow(pool.free_workers())
        else:
            missing = sorted(set(range(self._requested)) - {s.index for s in pool.slots})
            if not missing:
                return
            free = pool.free_workers()[: len(missing)]
            new = pool.grow(free, missing[: len(free)])
        if new:
            self.num_collectors = len(pool.slots)
            logger.info("started collectors %s on joining workers", [s.index for s in new])

    def _settle_retired(self, wait: bool) -> None:
        """Counts collectors released because their worker retired; replaces them in fixed mode.

        Their batches were all delivered, so nothing is lost and no restart is
        counted. In fixed mode a free worker, when there is one, takes over the
        index at once; otherwise the collection goes on with fewer collectors
        until a worker joins (see :meth:`_maybe_grow`).
        """
        gone = self._pool.take_retired(wait)
        if gone:
            self._failures.retired += len(gone)
            logger.info("collectors %s closed: their workers retired", [s.index for s in gone])
            self.num_collectors = len(self._pool.slots)
        if gone or not self._pool.slots:
            self._maybe_grow()

    # --- failures -----------------------------------------------------------
    def _env_failed(self, rollout: Rollout) -> bool:
        """Counts a rollout that ended in an env error under ``on_env_error="restart"``."""
        if rollout.error is None:
            return False
        fpc = self.batch_options.frames_per_collector(self.num_collectors)
        self._failures.env_restarts += 1
        self._failures.lost(
            1, fpc, f"collector {rollout.index}: env error, collector rebuilt:\n{rollout.error}"
        )
        logger.warning("collector %d: env error, rebuilt the collector", rollout.index)
        self._failures.check_budget(self.fault_options.max_collector_restarts)
        return True

    def _recover(self, lost: CollectorLost) -> Slot | None:
        """Drops a lost collector's calls whole and starts a replacement with the latest weights.

        Returns:
            The replacement, or ``None`` when following a cluster that shrank.
        """
        pool, slot = self._pool, lost.slot
        live_workers(self.client)  # a lost scheduler is a ClusterConnectionError, not a restart
        dropped = pool.abandon(slot) + lost.calls
        fpc = self.batch_options.frames_per_collector(self.num_collectors)
        self._failures.lost(dropped, fpc, f"collector {slot.index} on {slot.address}: {lost.cause}")
        logger.warning("collector %d lost (%s)", slot.index, lost.cause)
        if lost.hung:
            # A stuck actor thread blocks every later actor call on that worker: restart it.
            with contextlib.suppress(Exception):
                self.client.restart_workers([slot.address], timeout=config.timeout("shutdown"))
        if self._follow and not pool.free_workers():
            # Following the cluster, which shrank (scale-down, adapt): go on with fewer
            # collectors; a worker that joins later gets one again.
            self.num_collectors = len(pool.slots)
            logger.warning("collector %d dropped: its worker left and none is free", slot.index)
            return None
        self._failures.restarts += 1
        self._failures.check_budget(self.fault_options.max_collector_restarts)
        time.sleep(config.seconds("restart-delay"))
        seed = None if self._seed is None else self._seed + 7919 * self._failures.restarts
        return pool.replace(slot, seed=seed)

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: TorchRL's, plus losses, restarts and per-collector rates.

        Returns:
            ``frames``, ``batches``, (``total_frames``, ``completed``), ``policy_version``,
            ``frames_lost`` (frames of rollouts dropped whole), ``rollouts_lost``,
            ``restarts`` (collectors replaced after a lost worker or a stuck
            rollout), ``env_restarts`` (``on_env_error="restart"`` rebuilds),
            ``retired`` (collectors closed, losing nothing, as their worker retired),
            ``live_collectors``, and ``collectors``: per collector, its worker,
            incarnation, frames and frames/s (frames over rollout time).
        """
        out: dict[str, Any] = dict(super().stats())
        out.update(self._failures.as_dict())
        slots = self._pool.slots if self._pool else []
        out["live_collectors"] = len(slots)
        busy = self._pool.busy_slots() if self._pool else set()
        out["collectors"] = [
            {
                "index": s.index,
                "worker": s.address,
                "collector_id": s.uid,
                "state": "retiring" if s.retiring else "collecting" if s.index in busy else "idle",
                "rollouts": s.rollouts,
                "frames": s.frames,
                "fps": s.frames / s.seconds if s.seconds else 0.0,
                "policy_version": s.policy_version,
            }
            for s in slots
        ]
        return out

    def _report(self, state: str = "collecting", force: bool = False) -> None:
        """Sends a stats snapshot to the scheduler's dashboard page (throttled, never blocking)."""
        now = time.monotonic()
        if self.client is None or (not force and now < self._next_report):
            return
        self._next_report = now + config.seconds("dashboard.report-interval")
        try:
            stats = self.stats()
            elapsed = now - self._started
            msg = {
                **{k: v for k, v in stats.items() if isinstance(v, (int, float, str, list)) or v is None},
                "id": self._report_id,
                "name": f"DaskCollector {self._report_id}",
                "mode": "sync" if self.batch_options.sync else "async",
                "state": state,
                "fps": self._frames / elapsed if elapsed > 0 else 0.0,
            }
            log = functools.partial(self.client.scheduler.log_event, topic=dashboard.TOPIC, msg=msg)
            if force:  # at shutdown: deliver it before the client goes (bounded)
                self.client.sync(log, callback_timeout=config.timeout("call"))
            else:
                self.client.loop.add_callback(log)
        except Exception as exc:  # monitoring must never break a collection
            logger.debug("could not report to the dashboard: %s", exc)

    # --- weights ------------------------------------------------------------
    def _refresh_weights(self, slots: list[Slot]) -> None:
        """Applies ``update_after_each_batch`` / ``max_weight_update_interval``."""
        if self.policy is None or not isinstance(self.policy, torch.nn.Module):
            return
        options = self.weight_options
        if options.update_after_each_batch:
            stale = list(slots)
        elif options.max_weight_update_interval > -1:
            stale = [s for s in slots if s.batches_since_update > options.max_weight_update_interval]
        else:
            return
        if stale:
            self.update_policy_weights_(worker_ids=[s.index for s in stale])

    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: int | Sequence[int] | None = None,
        **kwargs: Any,
    ) -> None:
        """Sends new policy weights to the collectors, serialized once.

        Collectors on the driver's host read them from one shared-memory file
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

        Raises:
            ConfigurationError: If there are no weights to send or the
                arguments conflict.
        """
        self._check_open()
        if kwargs.get("weights_dict") is not None or kwargs.get("model_id") not in (None, "policy"):
            raise ConfigurationError(
                "DaskCollector syncs a single policy: pass its weights, without weights_dict or model_id."
            )
        given = [x for x in (policy_or_weights, weights, policy) if x is not None]
        if len(given) > 1:
            raise ConfigurationError("Pass weights once: positionally, as weights= or as policy=.")
        source = given[0] if given else self.policy
        if source is None:
            raise ConfigurationError(
                "There are no weights to send: this collector was built without a policy. "
                "Pass them, e.g. collector.update_policy_weights_(TensorDict.from_module(policy))."
            )
        slots = self._select(worker_ids)
        td = extract_weights(source)
        if self.client.scheduler.address.startswith("inproc://"):
            td = td.clone()  # in-process workers would otherwise share our tensors
        self._policy_version += 1
        self._pool.scatter_weights(WeightsPayload.from_tensordict(td, self._policy_version), slots)

    def _select(self, worker_ids: int | Sequence[int] | None) -> list[Slot]:
        by_index = {s.index: s for s in self._pool.slots}
        if worker_ids is None:
            return list(by_index.values())
        ids = [worker_ids] if isinstance(worker_ids, int) else list(worker_ids)
        bad = [i for i in ids if i not in by_index]
        if bad:
            raise ConfigurationError(
                f"worker_ids {bad} are not collector indices; valid ones are {sorted(by_index)}."
            )
        return [by_index[i] for i in ids]

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
        self._seed = seed
        if self._pool.num_inflight:
            self._pool.drain(config.timeout("rollout"))  # no rollout may straddle the reseed
        for slot in self._pool.slots:
            seed = self._pool.call(slot, "set_seed", seed, static_seed)
        self._pool.call_all("reset")
        return seed

    def state_dict(self) -> OrderedDict:
        """Each collector's state dict, and the driver's counters."""
        self._check_open()
        return OrderedDict(
            collectors=self._pool.call_all("state_dict"),
            frames=self._frames,
            iterations=self._iter + 1,
            policy_version=self._policy_version,
        )

    def load_state_dict(self, state_dict: OrderedDict | Sequence[dict]) -> None:
        """Loads what :meth:`state_dict` returned (or a list, one per collector)."""
        self._check_open()
        if isinstance(state_dict, (list, tuple)):
            per_collector = list(state_dict)
        else:
            per_collector = list(state_dict["collectors"])
            self._frames = state_dict.get("frames", self._frames)
            self._iter = state_dict.get("iterations", self._iter + 1) - 1
            self._policy_version = state_dict.get("policy_version", self._policy_version)
        if len(per_collector) != len(self._pool.slots):
            raise ConfigurationError(
                f"The state dict holds {len(per_collector)} collectors but this collector has "
                f"{len(self._pool.slots)}. Load it into a DaskCollector with as many collectors."
            )
        calls = [s.actor.load_state_dict(sd) for s, sd in zip(self._pool.slots, per_collector)]
        for call in calls:
            call.result(timeout=config.timeout("call"))

    # --- shutdown -----------------------------------------------------------
    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Closes our actors and plugin, and a private cluster; idempotent and bounded.

        A cluster given by the user stays up; only what this collector created goes.
        """
        if self._closed:
            return
        self._closed = True
        timeout = config.timeout("shutdown") if timeout is None else timeout
        if self._pool is not None:
            self._report("closed", force=True)
            self._pool.close(timeout)
        if self._ledger is not None:
            self._ledger.close()
        if self._driver_threads is not None:
            torch.set_num_threads(self._driver_threads)
            self._driver_threads = None
        if self._handle is not None:
            if self._plugin_name is not None and self._handle.cluster is None:
                try:
                    self._handle.client.unregister_worker_plugin(self._plugin_name)
                except Exception as exc:  # scheduler gone: nothing left to undo
                    logger.debug("could not unregister %s: %s", self._plugin_name, exc)
            self._handle.close(timeout)

    def __enter__(self) -> DaskCollector:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def __del__(self):
        if getattr(self, "_closed", True) is False:
            warnings.warn(
                f"{self!r} was not shut down; call shutdown() or use it as a context manager.",
                ResourceWarning,
                stacklevel=2,
            )
