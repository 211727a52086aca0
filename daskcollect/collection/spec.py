"""From ``DaskCollector``'s keywords to a validated, frozen :class:`CollectionSpec` and the recipes.

Every keyword is checked here, once, before any cluster is touched: a bad
value is a :class:`~daskcollect.errors.ConfigurationError` naming the keyword
and the fix. The spec then builds one cloudpickled
:class:`~daskcollect.worker.recipe.CollectorRecipe` per collector.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchrl.collectors import BaseCollector, Collector, MultiAsyncCollector, MultiSyncCollector

from daskcollect.collection.memmap import check_writable
from daskcollect.collection.options import (
    BatchOptions,
    ClusterOptions,
    FaultOptions,
    OutputOptions,
    WeightOptions,
)
from daskcollect.errors import ConfigurationError
from daskcollect.inference.options import InferenceOptions, inference_options
from daskcollect.settings import Settings
from daskcollect.weights import scheme as weight_scheme
from daskcollect.worker.recipe import CollectorRecipe, accepts, counts_dialog_turns

_COLLECTOR_ALIASES = {"single": Collector, "sync": MultiSyncCollector, "async": MultiAsyncCollector}
#: RayCollector keywords that have no meaning on Dask; accepted so that code
#: written for Ray runs unchanged, and ignored with a warning.
RAY_ONLY = (
    "ray_init_config",
    "remote_configs",
    "weight_recv_schemes",
)
_DEVICES = ("device", "storing_device", "env_device", "policy_device")
#: Top-level keywords that overwrite the same keys of ``collector_kwargs``, as RayCollector's do.
OVERRIDING = ("max_frames_per_traj", "reset_at_each_iter", "exploration_type")
#: Top-level keywords that only fill ``collector_kwargs`` where it lacks them (and are not ``None``).
DEFAULTING = ("trust_policy", "no_cuda_sync", "trajs_per_batch", "pre_collect_hook", "post_collect_hook")


def per_collector(value: Any, name: str, n: int) -> list:
    """Broadcasts ``value`` to ``n`` collectors, or checks a list's length."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ConfigurationError(
                f"{name} is a list of length {len(value)} but there are {n} collectors. "
                f"Pass one {name} per collector, or a single value for all."
            )
        return list(value)
    return [value] * n


def resolve_collector_class(collector_class: Any) -> type:
    """A TorchRL collector class from a class or one of ``"single"``, ``"sync"``, ``"async"``."""
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


def _check_replay_buffer(replay_buffer: Any, memmap: bool) -> None:
    if replay_buffer is None:
        return
    if not callable(getattr(replay_buffer, "extend", None)):
        raise ConfigurationError(
            f"replay_buffer must be a torchrl.data.ReplayBuffer (with .extend), got "
            f"{type(replay_buffer).__name__}."
        )
    from daskcollect.replay_buffer import DaskReplayBuffer

    if memmap and isinstance(replay_buffer, DaskReplayBuffer):
        raise ConfigurationError(
            "With a DaskReplayBuffer the collectors extend the buffer themselves and nothing is written "
            "to memmap_dir: drop output='memmap'."
        )
    storage = getattr(replay_buffer, "_storage", None)
    if memmap and type(storage).__name__ == "ListStorage":
        raise ConfigurationError(
            "A ListStorage keeps references to the memory-mapped batches, whose files are deleted "
            "once the buffer is extended. Use LazyTensorStorage or LazyMemmapStorage with "
            "output='memmap'."
        )


def _check_ray_only(ray_only: Mapping[str, Any]) -> None:
    unknown = set(ray_only) - set(RAY_ONLY)
    if unknown:
        raise TypeError(f"DaskCollector got unexpected keyword arguments {sorted(unknown)}")
    for name, value in ray_only.items():
        if value is not None:
            warnings.warn(f"{name} is specific to Ray and is ignored by DaskCollector.", stacklevel=4)


@dataclass(frozen=True)
class RecipeInputs:
    """What the recipes are built from (one value, or one per collector, each)."""

    create_env_fn: Any
    policy: Any
    policy_factory: Any
    collector_class: type
    collector_kwargs: Any
    num_envs: int
    devices: Mapping[str, Any]
    passed: Mapping[str, Any]
    init_random_frames: int | None
    use_env_creator: bool


@dataclass(frozen=True)
class CollectionSpec:
    """Everything a collection is, validated once.

    Attributes:
        batch, weights, cluster, output, faults: The option groups.
        num_collectors: Collectors asked for; ``None``: one per eligible worker.
        follow: Follow the cluster: a worker that joins gets a collector, one
            that leaves takes its collector with it.
        seed: ``set_seed(seed)`` once the collectors exist.
        inputs: What the recipes are built from.
        inference: Central inference (``inference="server"``), or ``None``.
    """

    batch: BatchOptions
    weights: WeightOptions
    cluster: ClusterOptions
    output: OutputOptions
    faults: FaultOptions
    num_collectors: int | None
    follow: bool
    seed: int | None
    inputs: RecipeInputs = field(repr=False)
    inference: InferenceOptions | None = None

    @classmethod
    def from_keywords(cls, settings: Settings, kw: dict[str, Any]) -> CollectionSpec:
        """Validates ``DaskCollector``'s keywords (``kw``, by name).

        Raises:
            ConfigurationError: Naming the keyword and the fix.
            TypeError: For a keyword that neither TorchRL nor Ray knows.
        """
        _check_ray_only(kw.get("ray_only", {}))
        batch = BatchOptions(
            kw["frames_per_batch"], kw["total_frames"], bool(kw["sync"]), kw["split_trajs"], kw["postproc"]
        )
        updater, schemes = weight_scheme.resolve(kw["weight_updater"], kw["weight_sync_schemes"])
        weights = WeightOptions(
            kw["update_after_each_batch"], kw["max_weight_update_interval"], bool(kw["track_policy_version"]),
            updater, schemes, kw["max_policy_lag"],
        )  # fmt: skip
        cluster = ClusterOptions(
            kw["client"],
            kw["scheduler_file"],
            kw["worker_env"] or {},
            kw["worker_resources"],
            kw["security"],
            kw["py_modules"] or (),
        )
        max_unreleased = kw["max_unreleased"]
        output = OutputOptions(
            kw["output"], kw["memmap_dir"], kw["memmap_retention"],
            settings.max_unreleased if max_unreleased is None else max_unreleased, kw["replay_buffer"],
            bool(kw["trace_frames"]),
        )  # fmt: skip
        if output.memmap and (batch.postproc is not None or batch.split_trajs):
            raise ConfigurationError(
                "postproc and split_trajs need the data on the driver; with output='memmap' apply "
                "them to batch.load() yourself."
            )
        _check_replay_buffer(kw["replay_buffer"], output.memmap)
        if output.memmap:
            check_writable(output.memmap_dir, "the driver")
        restarts = kw["max_collector_restarts"]
        faults = FaultOptions(
            settings.max_collector_restarts if restarts is None else restarts, kw["on_env_error"]
        )
        num_collectors, follow = cls._collectors(kw)
        num_envs = kw["num_workers_per_collector"]
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ConfigurationError(f"num_workers_per_collector must be an int >= 1, got {num_envs!r}.")
        inputs = RecipeInputs(
            kw["create_env_fn"], kw["policy"], kw["policy_factory"],
            resolve_collector_class(kw["collector_class"]), kw["collector_kwargs"], num_envs,
            {k: kw[k] for k in _DEVICES}, {k: kw[k] for k in OVERRIDING + DEFAULTING}, kw["init_random_frames"],
            bool(kw["use_env_creator"]),
        )  # fmt: skip
        inference = inference_options(kw, inputs.collector_class)
        if inference is not None and settings.reattach_grace:
            raise ConfigurationError(
                "daskcollect.reattach.grace-period is set, but inference='server' cannot be re-attached: its "
                "servers end with the driver that started them. Leave the grace period unset (null) for this "
                "collection (dask.config.set({'daskcollect.reattach.grace-period': None})), or resume it "
                "from a checkpoint (resume_from=)."
            )
        spec = cls(
            batch, weights, cluster, output, faults, num_collectors, follow, kw["seed"], inputs, inference
        )
        if num_collectors is not None:  # otherwise the cluster says, and recipes() checks then
            spec.check_count(num_collectors)
        return spec

    @staticmethod
    def _collectors(kw: dict[str, Any]) -> tuple[int | None, bool]:
        """``num_collectors`` (``None``: from the cluster) and whether to follow the cluster."""
        envs, n = kw["create_env_fn"], kw["num_collectors"]
        listed = isinstance(envs, (list, tuple))
        if n not in (None, "auto") and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigurationError(f"num_collectors must be an int >= 1 or 'auto', got {n!r}.")
        given = kw["client"] is not None or kw["scheduler_file"] is not None
        follow = not listed and (n == "auto" or (n is None and given))
        if n == "auto":
            if listed:
                raise ConfigurationError(
                    "num_collectors='auto' needs a single create_env_fn (every new worker runs it); "
                    "pass one constructor, or a fixed num_collectors."
                )
            n = None
        if listed:
            if n is not None and n != len(envs):
                raise ConfigurationError(
                    f"create_env_fn is a list of length {len(envs)} but num_collectors={n}. Pass one "
                    "env constructor per collector, or leave num_collectors unset."
                )
            n = len(envs)
        elif not callable(envs):
            raise ConfigurationError(
                f"create_env_fn must be a callable returning an env (or a list of them), got "
                f"{type(envs).__name__}. Pass e.g. lambda: GymEnv('CartPole-v1')."
            )
        return n, follow

    def check_count(self, n: int) -> None:
        """Checks the settings that depend on the number of collectors: per-collector lists and the
        memmap bound (before connecting when ``num_collectors`` is known, else once the cluster says).

        Raises:
            ConfigurationError: Naming the keyword and the fix.
        """
        self._per_collector_inputs(n)
        out = self.output
        if out.memmap and self.batch.sync and out.max_unreleased < n:
            raise ConfigurationError(
                f"max_unreleased={out.max_unreleased} is below num_collectors={n}: a sync batch holds "
                "one rollout folder per collector. Raise max_unreleased."
            )

    def _collector_kwargs(
        self, kwargs: dict[str, Any], n: int, devices: dict[str, Any], scheme: Any
    ) -> dict[str, Any]:
        """One worker's collector keywords, with RayCollector's precedence (docs/api.md).

        ``collector_kwargs`` come first; the hooks, ``trajs_per_batch``,
        ``trust_policy`` and ``no_cuda_sync`` fill only what they lack; the
        batch size, the devices, ``max_frames_per_traj``, ``init_random_frames``
        (split over the collectors), ``reset_at_each_iter`` and
        ``exploration_type`` overwrite them.
        """
        inputs = self.inputs
        if counts_dialog_turns(inputs.collector_class):
            return self._dialog_kwargs(kwargs, n)
        for key in DEFAULTING:
            if inputs.passed[key] is not None:
                kwargs.setdefault(key, inputs.passed[key])
        if accepts(inputs.collector_class, "auto_register_policy_transforms"):
            # TorchRL 0.14 warns (FutureWarning, per collector) that it will add InitTracker
            # to the env of any module policy in 0.15. We keep the env as the user built it,
            # 0.14's behaviour, and say so: pass True in collector_kwargs to have TorchRL
            # append the transforms a recurrent policy needs.
            kwargs.setdefault("auto_register_policy_transforms", False)
        kwargs.update({key: inputs.passed[key] for key in OVERRIDING})
        kwargs.update(devices)
        kwargs["init_random_frames"] = max(0, int(inputs.init_random_frames or 0)) // n
        kwargs["frames_per_batch"] = self.batch.frames_per_collector(n)
        kwargs["split_trajs"] = False  # split on the driver, after stacking
        if scheme is not None and "weight_sync_schemes" not in kwargs:
            kwargs["weight_sync_schemes"] = {"policy": scheme}
        return kwargs

    def _dialog_kwargs(self, kwargs: dict[str, Any], n: int) -> dict[str, Any]:
        """An ``LLMCollector``'s keywords: its batch counts dialog turns, and the env-collector
        keywords (devices, exploration, random frames, trajectory splitting) do not apply."""
        # The top-level value overwrites collector_kwargs', as OVERRIDING's keywords do for env collectors.
        kwargs["reset_at_each_iter"] = bool(self.inputs.passed["reset_at_each_iter"])
        kwargs["dialog_turns_per_batch"] = self.batch.frames_per_collector(n)
        return kwargs

    def _inner_scheme(self) -> Any:
        """TorchRL's shared-memory scheme for a factory-built policy in ``Multi*Collector`` processes.

        Such a policy lives in the inner processes only: the scheme carries each
        update from the worker's collector to them, as RayCollector arranges.
        """
        inputs = self.inputs
        multi = issubclass(inputs.collector_class, (MultiSyncCollector, MultiAsyncCollector))
        if not (multi and inputs.policy is None and inputs.policy_factory is not None):
            return None
        from torchrl.weight_update import SharedMemWeightSyncScheme

        return SharedMemWeightSyncScheme()

    def _per_collector_inputs(self, n: int) -> tuple[list, list, list, dict[str, list]]:
        """The env constructors, policy factories, collector keywords and devices of ``n`` collectors.

        Raises:
            ConfigurationError: If a list's length is not ``n``.
        """
        inputs = self.inputs
        return (
            per_collector(inputs.create_env_fn, "create_env_fn", n),
            per_collector(inputs.policy_factory, "policy_factory", n),
            per_collector(inputs.collector_kwargs or {}, "collector_kwargs", n),
            {k: per_collector(v, k, n) for k, v in inputs.devices.items()},
        )

    def recipes(self, n: int, policies: list[Any] | None = None) -> list[bytes]:
        """One cloudpickled recipe per collector; identical recipes are pickled once and shared.

        Args:
            n: Collectors.
            policies: One policy per collector instead of ``policy=`` and
                ``policy_factory=`` (central inference's clients).
        """
        inputs = self.inputs
        envs, factories, user_kwargs, devices = self._per_collector_inputs(n)
        scheme = self._inner_scheme()
        blobs: list[tuple[CollectorRecipe, bytes]] = []
        out = []
        for i in range(n):
            kwargs = self._collector_kwargs(
                dict(user_kwargs[i]), n, {k: v[i] for k, v in devices.items()}, scheme
            )
            env = envs[i]
            if inputs.use_env_creator:
                from torchrl.envs import EnvBase, EnvCreator

                env = env if isinstance(env, (EnvBase, EnvCreator)) else EnvCreator(env)
            policy, factory = (inputs.policy, factories[i]) if policies is None else (policies[i], None)
            recipe = CollectorRecipe(env, policy, factory, inputs.collector_class, kwargs, inputs.num_envs)
            blob = next((b for r, b in blobs if r == recipe), None)
            if blob is None:
                blob = recipe.dumps()
                blobs.append((recipe, blob))
            out.append(blob)
        return out
