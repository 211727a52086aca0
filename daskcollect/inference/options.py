"""``DaskCollector``'s central-inference keywords, validated once (:func:`inference_options`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from daskcollect.errors import ConfigurationError

#: Keys of ``inference_options=``.
OPTION_KEYS = ("max_batch_size", "device", "torch_threads", "max_in_flight")


@dataclass(frozen=True)
class InferenceOptions:
    """``DaskCollector``'s ``inference_*`` keywords, validated.

    Attributes:
        workers: Inference servers to start, one per worker.
        resources: Resources a worker must declare to host one (``{"GPU": 1}``).
        device: Where each server runs the policy (``None``: where it is).
        max_batch_size: The most requests one forward pass serves.
        track_policy_version: Servers write their weights' version under
            ``"policy_version"`` in every answer.
        torch_threads: Each server's torch threads; ``None``: its worker's ``nthreads``.
        max_in_flight: The most requests a collector has unanswered (TorchRL's
            ``PolicyClientModule(max_inflight=)``): a collector's policy call
            waits for its answer, so one is enough unless user code submits
            several.
    """

    workers: int = 1
    resources: Mapping[str, float] | None = None
    device: str | None = None
    max_batch_size: int = 64
    track_policy_version: bool = False
    torch_threads: int | None = None
    max_in_flight: int = 1


def inference_options(kw: dict[str, Any], collector_class: type) -> InferenceOptions | None:
    """The ``inference*`` keywords of ``DaskCollector`` (``kw``, by name), or ``None`` when off.

    Raises:
        ConfigurationError: Naming the keyword and the fix.
    """
    mode = kw["inference"]
    if mode is None:
        return None
    if mode != "server":
        raise ConfigurationError(f"inference={mode!r} is not known: use inference='server', or leave it out.")
    from tensordict.nn import TensorDictModuleBase
    from torchrl.collectors import Collector

    if not isinstance(kw["policy"], TensorDictModuleBase) or kw["policy_factory"] is not None:
        raise ConfigurationError(
            "inference='server' serves the policy module given as policy= (a TensorDictModule, with in_keys "
            "and out_keys) from the inference servers; policy_factory= is not supported there."
        )
    if not issubclass(collector_class, Collector):
        raise ConfigurationError(
            "inference='server' runs envs in each worker's own Collector (collector_class=Collector); "
            "for several envs per worker use num_workers_per_collector=."
        )
    workers = kw["inference_workers"]
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigurationError(f"inference_workers must be an int >= 1, got {workers!r}.")
    extra = dict(kw["inference_options"] or {})
    unknown = sorted(set(extra) - set(OPTION_KEYS))
    if unknown:
        raise ConfigurationError(
            f"inference_options has unknown keys {unknown}; known ones: {list(OPTION_KEYS)}."
        )
    batch = extra.get("max_batch_size", 64)
    if not isinstance(batch, int) or batch < 1:
        raise ConfigurationError(f"inference_options['max_batch_size'] must be an int >= 1, got {batch!r}.")
    device = extra.get("device")
    threads = extra.get("torch_threads")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigurationError(f"inference_options['torch_threads'] must be an int >= 1, got {threads!r}.")
    in_flight = extra.get("max_in_flight", 1)
    if not isinstance(in_flight, int) or isinstance(in_flight, bool) or in_flight < 1:
        raise ConfigurationError(
            f"inference_options['max_in_flight'] must be an int >= 1, got {in_flight!r}."
        )
    return InferenceOptions(
        workers=workers,
        resources=dict(kw["inference_resources"]) if kw["inference_resources"] else None,
        device=None if device is None else str(device),
        max_batch_size=batch,
        track_policy_version=bool(kw["track_policy_version"]),
        torch_threads=threads,
        max_in_flight=in_flight,
    )
