"""The fence, TorchRL and tensordict: their private attributes that daskcollect reads or sets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daskcollect._internals.versions import missing


# --- TorchRL and tensordict ---------------------------------------------------
def set_weight_sync_schemes(collector: Any, schemes: dict[str, Any] | None) -> None:
    """Gives a ``BaseCollector`` subclass its ``{model_id: scheme}``.

    ``BaseCollector.update_policy_weights_`` dispatches on this attribute, and
    TorchRL's trainers read it to find the collector's schemes; TorchRL has no
    public setter.
    """
    from torchrl.collectors import BaseCollector

    if not hasattr(BaseCollector, "_weight_sync_schemes"):
        raise missing("BaseCollector._weight_sync_schemes", AttributeError("_weight_sync_schemes"))
    collector._weight_sync_schemes = schemes


def collector_carrier(collector: Any) -> Any | None:
    """A TorchRL ``Collector``'s carrier (the tensordict its next step starts from), or ``None``.

    ``None`` for collectors that keep their carriers in their own processes
    (``Multi*Collector``) and for releases that renamed it.
    """
    from torchrl.collectors import Collector

    if not isinstance(collector, Collector):
        return None
    return getattr(collector, "_carrier", None)


def set_collector_carrier(collector: Any, carrier: Any) -> None:
    """Replaces a TorchRL ``Collector``'s carrier: its next rollout starts from ``carrier``."""
    if collector_carrier(collector) is None:
        raise missing("Collector._carrier", AttributeError("_carrier"))
    collector._carrier = carrier


def inference_stamp_key() -> str:
    """The key under which TorchRL's ``PolicyClientModule`` sends the caller's interaction type to an
    inference server (its requests always carry it)."""
    try:
        from torchrl.modules.inference_server._client import _REMOTE_INTERACTION_TYPE_KEY
    except ImportError as exc:
        raise missing("torchrl.modules.inference_server._client._REMOTE_INTERACTION_TYPE_KEY", exc) from None
    return _REMOTE_INTERACTION_TYPE_KEY


def default_exploration_type() -> Any:
    """TorchRL collectors' default ``exploration_type`` (``ExplorationType.RANDOM`` where TorchRL
    no longer keeps it in ``torchrl.collectors._constants``)."""
    try:
        from torchrl.collectors._constants import DEFAULT_EXPLORATION_TYPE
    except ImportError:
        from torchrl.envs.utils import ExplorationType

        return ExplorationType.RANDOM
    return DEFAULT_EXPLORATION_TYPE


def wrap_collector_policy(collector: Any, wrap: Callable[[Callable], Callable]) -> bool:
    """Makes a TorchRL ``Collector`` call ``wrap(policy)`` instead of its (uncompiled) policy.

    Returns:
        ``False``, changing nothing, where the collector keeps its policy
        elsewhere (another TorchRL release): the caller then goes without.
    """
    if not hasattr(collector, "_wrapped_policy_uncompiled") or not hasattr(collector, "_wrapped_policy"):
        return False
    collector._wrapped_policy = wrap(collector._wrapped_policy_uncompiled)
    return True


def tensordict_unchecked() -> Callable:
    """``TensorDict._new_unsafe``: builds a TensorDict without re-checking its leaves' shapes and
    devices (about 4 us against 24 us for the public constructor on a rollout batch); the public
    constructor where tensordict has no such method."""
    from tensordict import TensorDict

    return getattr(TensorDict, "_new_unsafe", TensorDict)


# --- TorchRL's front door: Collector(backend=...) -------------------------------
def _collector_meta() -> Any:
    try:
        from torchrl.collectors._single import Collector, _CollectorMeta
    except ImportError as exc:
        raise missing("torchrl.collectors._single._CollectorMeta", exc) from None
    for name in ("_BACKENDS", "_RESERVED_OPTIONS", "_normalize_env_fns", "_drop_inapplicable_defaults"):
        if not hasattr(_CollectorMeta, name):
            raise missing(f"torchrl.collectors._single._CollectorMeta.{name}", AttributeError(name))
    return _CollectorMeta, Collector


def _service_backends() -> Any:
    try:
        import torchrl._comm.backends as backends

        backends._SERVICE_BACKENDS, backends._get_service_backend, backends._SERVICE_BACKEND_CONTEXT  # noqa: B018
    except (ImportError, AttributeError) as exc:
        raise missing("torchrl._comm.backends._SERVICE_BACKENDS", exc) from None
    return backends


def collector_backends() -> frozenset[str]:
    """The backends ``torchrl.collectors.Collector(backend=...)`` accepts now."""
    meta, _ = _collector_meta()
    return frozenset(meta._BACKENDS)


def register_collector_backend(name: str, target: Callable[[], type]) -> None:
    """Makes ``Collector(..., backend=name)`` and ``torchrl.service_backend(name)`` build ``target()``.

    TorchRL dispatches ``Collector(...)`` through a fixed chain of backends
    (``_CollectorMeta.__call__``). This adds ``name`` to its two closed sets
    and puts one wrapper around that dispatch: a call whose backend, given or
    from the enclosing ``service_backend``, is ``name`` gets what TorchRL's
    ``backend="ray"`` branch does (the same checks of ``backend_options``,
    the env constructors normalized, the generic defaults dropped) with
    ``target()`` as the class. Every other call goes to TorchRL's dispatch
    unchanged. Idempotent.

    Args:
        name: The backend's name.
        target: Returns the collector class (imported only when first used).
    """
    meta, collector = _collector_meta()
    backends = _service_backends()
    backends._SERVICE_BACKENDS = frozenset({*backends._SERVICE_BACKENDS, name})
    meta._BACKENDS = frozenset({*meta._BACKENDS, name})
    dispatch = meta.__call__
    targets = getattr(dispatch, "daskcollect_targets", None)
    if targets is None:
        targets = {}

        def __call__(
            cls, *args, backend=None, backend_options=None, num_collectors=None, sync=None, **kwargs
        ):
            chosen = backend if backend is not None else backends._get_service_backend()
            if cls is collector and chosen is not None:
                chosen = backends.normalize_service_backend(chosen)
            if cls is collector and chosen in targets:
                build = targets[chosen]()
                # What the collector builds on the driver must not see the scope's backend: ``name`` is
                # a collector backend only, as TorchRL's own backends end their scope at the collector.
                token = backends._SERVICE_BACKEND_CONTEXT.set(None)
                try:
                    return _build(cls, build, args, kwargs, backend_options, num_collectors, sync)
                finally:
                    backends._SERVICE_BACKEND_CONTEXT.reset(token)
            return dispatch(cls, *args, backend=backend, backend_options=backend_options,
                            num_collectors=num_collectors, sync=sync, **kwargs)  # fmt: skip

        __call__.daskcollect_targets = targets  # type: ignore[attr-defined]
        __call__.__wrapped__ = dispatch  # type: ignore[attr-defined]
        meta.__call__ = __call__
    targets[name] = target


def _build(meta_cls: Any, target: type, args: tuple, kwargs: dict, options: Any, n: Any, sync: Any) -> Any:
    """What TorchRL's ``_CollectorMeta.__call__`` does for ``backend="ray"``, with ``target`` as the class."""
    if len(args) > 2:
        raise TypeError("Collector accepts at most create_env_fn and policy positionally.")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise (TypeError if not isinstance(n, int) or isinstance(n, bool) else ValueError)(
            "num_collectors must be a positive integer."
        )
    options = dict(options or {})
    reserved = type(meta_cls)._RESERVED_OPTIONS.intersection(options)
    if reserved:
        raise ValueError(f"backend_options contains reserved selector keys: {sorted(reserved)}.")
    duplicates = (options.keys() & kwargs.keys()) | (
        options.keys() & set(("create_env_fn", "policy")[: len(args)])
    )
    if duplicates:
        raise ValueError(f"Backend options duplicate top-level collector arguments: {sorted(duplicates)}.")
    if sync is not None and not isinstance(sync, bool):
        raise TypeError("sync must be a boolean or None.")
    kwargs.update(options)
    args, kwargs, n = type(meta_cls)._normalize_env_fns(args, kwargs, n)
    type(meta_cls)._drop_inapplicable_defaults(target, kwargs)
    return target(*args, num_collectors=n, sync=bool(sync), **kwargs)


def refuse_service_backend(name: str, advice: str) -> None:
    """Makes TorchRL's services (replay buffers, loggers, inference servers) refuse ``name`` with ``advice``.

    Once ``name`` is a service backend (:func:`register_collector_backend`),
    ``torchrl.service_backend(name)`` would reach services that cannot run
    on it. Each then raises :class:`~daskcollect.errors.ConfigurationError`
    naming the service and what to use instead. Idempotent.
    """
    from daskcollect.errors import ConfigurationError

    backends = _service_backends()
    try:
        from torchrl._utils import _RayServiceMetaClass
        from torchrl.modules.inference_server._server import _InferenceServerMeta
    except ImportError as exc:
        raise missing("torchrl._utils._RayServiceMetaClass / _InferenceServerMeta", exc) from None
    for meta in (_RayServiceMetaClass, _InferenceServerMeta):
        dispatch = meta.__call__
        refused = getattr(dispatch, "daskcollect_refused", None)
        if refused is None:
            refused = {}

            def __call__(cls, *args, _dispatch=dispatch, _refused=refused, **kwargs):
                chosen = kwargs.get("service_backend") or backends._get_service_backend()
                if chosen in _refused:
                    raise ConfigurationError(
                        f"{cls.__name__} cannot run on the {chosen!r} service backend: TorchRL's services run "
                        f"as threads, processes or Ray actors. {_refused[chosen]} Or build it outside the "
                        f"torchrl.service_backend({chosen!r}) scope.",
                        key="service_backend",
                    )
                return _dispatch(cls, *args, **kwargs)

            __call__.daskcollect_refused = refused  # type: ignore[attr-defined]
            __call__.__wrapped__ = dispatch  # type: ignore[attr-defined]
            meta.__call__ = __call__
        refused[name] = advice
