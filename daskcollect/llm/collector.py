"""``DaskLLMCollector``: TorchRL's ``RayLLMCollector`` keywords, on a fleet of Dask actors.

Each collector is TorchRL's own ``LLMCollector``, built on its worker inside a
:class:`~daskcollect.worker.actor.CollectorActor`, with the model made there by
``policy_factory`` (models do not pickle well). Everything else is
:class:`~daskcollect.DaskCollector`'s: placement by ``worker_resources``,
weights through :class:`~daskcollect.DaskWeightSyncScheme` (shared memory on
the driver's host, one scatter and a tree elsewhere), replacement of lost
collectors with exact accounting, checkpoints and resume. Budgets and batches
count dialog turns, as ``LLMCollector``'s do.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from daskcollect.collector import DaskCollector
from daskcollect.errors import ConfigurationError


class DaskLLMCollector(DaskCollector):
    """Collects LLM dialog turns with TorchRL ``LLMCollector``s hosted in Dask actors.

    The keywords are ``RayLLMCollector``'s, plus ``DaskCollector``'s cluster
    keywords; ``sync_iter`` chooses the mode, as RayLLMCollector's docstring
    likens it to ``MultiSyncCollector`` (``True``) and ``MultiAsyncCollector``
    (``False``).

    Args:
        env: The env constructor (e.g. a function returning
            ``LLMEnv.from_dataloader(...)`` or ``ChatEnv.from_dataloader(...)``),
            or one per collector.

    Keyword Args:
        policy: A picklable policy, copied to every worker; prefer ``policy_factory``.
        policy_factory: A callable building the policy (model, tokenizer,
            ``TransformersWrapper``/``vLLMWrapper``) on the worker.
        dialog_turns_per_batch: Dialog turns per yielded batch (sync: split
            over the collectors; async: each collector's batch).
        total_dialog_turns: Dialog turns in all; ``-1`` is endless.
        yield_only_last_steps: As in ``LLMCollector``.
        yield_completed_trajectories: As in ``LLMCollector``.
        postproc: Applied to each batch on the driver.
        async_envs: As in ``LLMCollector`` (the env must be an ``AsyncEnvPool``).
        replay_buffer: Each batch extends it and the iterator yields ``None``;
            a :class:`~daskcollect.DaskReplayBuffer` is extended from the workers.
        reset_at_each_iter: As in ``LLMCollector``.
        flatten_data: As in ``LLMCollector``.
        weight_updater: As in ``DaskCollector`` (a legacy ``WeightUpdaterBase``).
        track_policy_version: Write the version of the weights that produced
            each dialog turn under ``"policy_version"``.
        sync_iter: ``True``: each batch stacks one share of every collector;
            ``False``: batches come in completion order while the others go on.
        verbose: As in ``LLMCollector``.
        num_collectors: Collectors; defaults as in ``DaskCollector``.
        client: A ``distributed.Client``, a scheduler address, or ``None``
            for a private ``LocalCluster``.
        scheduler_file: A scheduler file, instead of ``client``.
        worker_resources: What a worker must declare to host a collector,
            e.g. ``{"GPU": 1}``.
        **kwargs: Any other ``DaskCollector`` keyword (``seed``,
            ``max_collector_restarts``, ``weight_sync_schemes``, ``worker_env``,
            ``resume_from``...). ``RayLLMCollector``'s Ray keywords
            (``ray_init_config``, ``remote_config``, ``num_cpus``, ``num_gpus``)
            are accepted and ignored with a warning; ``worker_resources`` places
            collectors instead.

    Raises:
        ConfigurationError: For a keyword of env collectors that dialog turns
            have no use for, or a missing ``dialog_turns_per_batch``.
    """

    def __init__(
        self,
        env: Callable | Sequence[Callable],
        *,
        policy: Callable | None = None,
        policy_factory: Callable | Sequence[Callable] | None = None,
        dialog_turns_per_batch: int | None = None,
        total_dialog_turns: int = -1,
        yield_only_last_steps: bool | None = None,
        yield_completed_trajectories: bool | None = None,
        postproc: Callable | None = None,
        async_envs: bool | None = None,
        replay_buffer: Any = None,
        reset_at_each_iter: bool = False,
        flatten_data: bool | None = None,
        weight_updater: Any = None,
        track_policy_version: bool = False,
        sync_iter: bool = True,
        verbose: bool = False,
        num_collectors: int | None = None,
        client: Any = None,
        scheduler_file: str | None = None,
        worker_resources: dict[str, float] | None = None,
        **kwargs: Any,
    ):
        _check_keywords(kwargs)
        if dialog_turns_per_batch is None:
            if not (yield_completed_trajectories or yield_only_last_steps):
                raise ConfigurationError(
                    "dialog_turns_per_batch is required unless yield_completed_trajectories=True "
                    "(then each collector yields one completed trajectory at a time)."
                )
            # LLMCollector's default, one turn per collector: a sync batch takes one from each.
            dialog_turns_per_batch = num_collectors if sync_iter and num_collectors else 1
        given = {"yield_only_last_steps": yield_only_last_steps, "async_envs": async_envs,
                 "yield_completed_trajectories": yield_completed_trajectories,
                 "flatten_data": flatten_data, "verbose": verbose}  # fmt: skip
        super().__init__(
            env,
            policy,
            policy_factory=policy_factory,
            frames_per_batch=dialog_turns_per_batch,
            total_frames=total_dialog_turns,
            reset_at_each_iter=reset_at_each_iter,
            postproc=postproc,
            collector_class=_llm_collector_class(),
            collector_kwargs={k: v for k, v in given.items() if v is not None},
            sync=sync_iter,
            num_collectors=num_collectors,
            track_policy_version=track_policy_version,
            weight_updater=weight_updater,
            replay_buffer=replay_buffer,
            client=client,
            scheduler_file=scheduler_file,
            worker_resources=worker_resources,
            **kwargs,
        )
        self.sync_iter = sync_iter
        self.yield_completed_trajectories = bool(yield_completed_trajectories or yield_only_last_steps)
        self.yield_only_last_steps = bool(yield_only_last_steps)

    @property
    def dialog_turns_per_batch(self) -> int:
        """Dialog turns per yielded batch (TorchRL's alias of ``frames_per_batch``)."""
        return self.requested_frames_per_batch

    @property
    def total_dialog_turns(self) -> int:
        """Dialog turns in all (``-1``: endless)."""
        return self.total_frames

    @property
    def init_random_frames(self) -> int:
        """Always 0, as for TorchRL's LLM collectors (read by TorchRL's ``Trainer``)."""
        return 0

    def get_policy_version(self) -> int:
        """The version of the latest weights sent (``RayLLMCollector``'s method)."""
        return self.policy_version

    def increment_version(self) -> None:
        """Refused: versions here count the updates sent, so they cannot be moved by hand.

        Raises:
            ConfigurationError: Always, naming the fix.
        """
        raise ConfigurationError(
            "DaskLLMCollector numbers the weights it sends: each update_policy_weights_() is the next "
            "version. Call update_policy_weights_() instead of increment_version()."
        )


def _llm_collector_class() -> type:
    from torchrl.collectors.llm import LLMCollector

    return LLMCollector


#: Ray's placement keywords, which ``worker_resources`` replaces on Dask.
_RAY_ONLY = ("ray_init_config", "remote_config", "num_cpus", "num_gpus")
#: Env-collector keywords that have no meaning for dialog turns.
_ENV_ONLY = ("frames_per_batch", "total_frames", "device", "storing_device", "env_device", "policy_device",
             "max_frames_per_traj", "init_random_frames", "split_trajs", "exploration_type",
             "collector_class", "collector_kwargs", "num_workers_per_collector", "sync", "inference",
             "inference_workers", "inference_resources", "inference_options")  # fmt: skip


def _check_keywords(kwargs: dict[str, Any]) -> None:
    """Drops Ray's placement keywords (with a warning) and refuses env-collector ones."""
    for name in _RAY_ONLY:
        if kwargs.pop(name, None) is not None:
            warnings.warn(
                f"{name} is specific to Ray and is ignored by DaskLLMCollector: place collectors with "
                "worker_resources= (e.g. {'GPU': 1}) and the workers' --resources.",
                stacklevel=3,
            )
    wrong = sorted(set(kwargs) & set(_ENV_ONLY))
    if wrong:
        raise ConfigurationError(
            f"DaskLLMCollector does not take {wrong}: its batches count dialog turns "
            "(dialog_turns_per_batch, total_dialog_turns), sync_iter chooses the mode, and each worker "
            "runs TorchRL's LLMCollector. Use DaskCollector for env collectors."
        )
