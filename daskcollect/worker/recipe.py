"""What a worker needs to build its TorchRL collector, and the build itself.

The driver cloudpickles a :class:`CollectorRecipe` once per collector, so env
constructors and policies defined in a user's ``__main__`` (lambdas, closures)
reach workers that never saw the script.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from daskcollect.deploy.py_modules import missing_module_hint
from daskcollect.errors import (
    CollectorBuildError,
    EnvConstructionError,
    PolicyFactoryError,
    PolicySerializationError,
)


def describe(obj: Any) -> str:
    """A short, readable name for a callable or object."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        return repr(obj)[:120]
    module = getattr(obj, "__module__", None)
    return f"{module}.{name}" if module else name


class _Guarded:
    """Wraps a user callable so that its failure on a worker names its cause."""

    def __init__(self, fn: Callable, error: type[CollectorBuildError], what: str, where: str):
        self.fn, self.error, self.what, self.where = fn, error, what, where

    def __call__(self, *args, **kwargs):
        try:
            return self.fn(*args, **kwargs)
        except Exception as exc:
            fix = missing_module_hint(exc) or (
                f"Fix the {self.what} so that it runs on the worker (imports, files and "
                "environment variables must exist there; worker_env= sets variables before it runs)."
            )
            raise self.error(
                f"{self.where}: the {self.what} {describe(self.fn)} raised "
                f"{type(exc).__name__}: {exc}\n\nOriginal traceback (on the worker):\n"
                f"{traceback.format_exc()}\n{fix}",
                original=repr(exc),
            ) from exc


@functools.cache
def accepts(cls: type, keyword: str) -> bool:
    """Whether ``cls(...)`` takes ``keyword`` by name (following ``**kwargs`` up to the parents)."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):
            return False
        if keyword in params:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False
    return False


def counts_dialog_turns(cls: type) -> bool:
    """Whether ``cls`` is an LLM collector (TorchRL's ``LLMCollector``): its batches and budget
    count dialog turns, under those names, instead of frames."""
    return accepts(cls, "dialog_turns_per_batch")


@contextlib.contextmanager
def _llm_notice_hidden():
    """Hides TorchRL 0.14's FutureWarning, on every ``LLMCollector`` build, that 0.15 will add InitTracker.

    LLMCollector cannot take ``auto_register_policy_transforms``; the env stays as built, as it does for
    the env collectors that get ``False`` (collection/spec.py). Only LLM builds are wrapped: filters that
    a user's constructors set while an env collector builds stay set.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The env passed to LLMCollector", FutureWarning)
        yield


def _factory(env: Any) -> Callable:
    """A constructor for ``ParallelEnv``: an env instance is copied into each sub-process."""
    from torchrl.envs import EnvBase

    return functools.partial(copy.deepcopy, env) if isinstance(env, EnvBase) else env


@dataclass(frozen=True)
class CollectorRecipe:
    """Everything one worker needs to build its TorchRL collector.

    Attributes:
        create_env_fn: The env constructor (callable or ``EnvCreator``).
        policy: The policy module, or ``None``.
        policy_factory: A callable building the policy on the worker, or ``None``.
        collector_class: The TorchRL collector class run on the worker.
        collector_kwargs: Keyword arguments for ``collector_class``.
        num_envs: Envs on this worker (``num_workers_per_collector``).
    """

    create_env_fn: Callable
    policy: Any
    policy_factory: Callable | None
    collector_class: type
    collector_kwargs: Mapping[str, Any] = field(default_factory=dict)
    num_envs: int = 1

    def dumps(self) -> bytes:
        """Cloudpickles the recipe, with an error that says what could not be pickled."""
        for what, obj in (
            ("policy", self.policy),
            ("policy_factory", self.policy_factory),
            ("env constructor", self.create_env_fn),
        ):
            try:
                cloudpickle.dumps(obj)
            except Exception as exc:
                raise PolicySerializationError(
                    f"The {what} {describe(obj)} cannot be pickled for the workers "
                    f"({type(exc).__name__}: {exc}). Pass a picklable object, or give "
                    "policy_factory= / a create_env_fn that builds the unpicklable parts "
                    "on the worker.",
                    what=what,
                ) from exc
        return cloudpickle.dumps(self)

    def build(self, where: str):
        """Builds the TorchRL collector (called on the worker).

        Args:
            where: Names the worker and collector in error messages.

        Returns:
            A TorchRL collector with ``total_frames=-1``.
        """
        from torchrl.collectors import Collector
        from torchrl.envs import EnvBase, ParallelEnv

        if isinstance(self.create_env_fn, EnvBase):
            # An instance arrives as the driver pickled it (transform statistics included).
            env_fn: Any = self.create_env_fn
        else:
            env_fn = _Guarded(self.create_env_fn, EnvConstructionError, "env constructor", where)
        dialog = counts_dialog_turns(self.collector_class)
        kwargs = dict(self.collector_kwargs)
        kwargs["total_dialog_turns" if dialog else "total_frames"] = -1
        if self.policy is not None:
            kwargs["policy"] = self.policy
        if self.policy_factory is not None:
            kwargs["policy_factory"] = _Guarded(
                self.policy_factory, PolicyFactoryError, "policy_factory", where
            )
        if issubclass(self.collector_class, Collector):
            env_arg: Any = env_fn if self.num_envs == 1 else ParallelEnv(self.num_envs, _factory(env_fn))
        else:
            env_arg = [env_fn] * self.num_envs
        try:
            with _llm_notice_hidden() if dialog else contextlib.nullcontext():
                return self.collector_class(env_arg, **kwargs)
        except CollectorBuildError:
            raise
        except Exception as exc:
            fix = "Check collector_kwargs, the devices and the policy against the env's specs."
            if "daemonic processes" in str(exc):
                fix = (
                    "This worker is a daemon process and cannot start the env's sub-processes "
                    "(ParallelEnv, Multi*Collector). Start the workers with "
                    "DASK_DISTRIBUTED__WORKER__DAEMON=False (dask config "
                    "distributed.worker.daemon: false), or use one env per collector."
                )
            raise CollectorBuildError(
                f"{where}: building {self.collector_class.__name__} failed with "
                f"{type(exc).__name__}: {exc}\n\nOriginal traceback (on the worker):\n"
                f"{traceback.format_exc()}\n{fix}",
                original=repr(exc),
            ) from exc
