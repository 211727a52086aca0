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
