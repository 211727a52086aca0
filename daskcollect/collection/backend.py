"""TorchRL's front door: ``Collector(..., backend="dask")`` and ``torchrl.service_backend("dask")``.

TorchRL 0.14 builds every collector through ``torchrl.collectors.Collector``,
whose ``backend=`` picks the class from a closed set. :func:`register` adds
``"dask"`` to it (through the fence, :func:`daskcollect._internals.register_collector_backend`):
``Collector(make_env, policy, backend="dask", num_collectors=4, sync=False,
frames_per_batch=..., total_frames=..., backend_options={"client": client})``
returns a :class:`~daskcollect.DaskCollector`, with the keywords that
``backend="ray"`` takes; ``backend_options`` carries Dask's (``client``,
``address``, ``scheduler_file``, ``worker_resources``, ...). TorchRL's other
services refuse the ``"dask"`` service backend with a typed error that names
what to use instead. ``import daskcollect`` registers it when TorchRL's
collectors load, so importing daskcollect never imports torch.
docs/torchrl_backend.md proposes the registry in TorchRL that would replace it.
"""

from __future__ import annotations

from daskcollect import _internals

#: The backend's name in ``Collector(backend=...)`` and ``torchrl.service_backend(...)``.
BACKEND = "dask"

#: What a TorchRL service asked to run on the ``"dask"`` backend is told to use instead.
ADVICE = (
    "On Dask, use daskcollect.DaskReplayBuffer for a replay buffer on a worker, and "
    "DaskCollector(..., inference='server') (or backend_options={'inference': 'server'}) for inference servers."
)


def _collector_class() -> type:
    from daskcollect.collector import DaskCollector

    return DaskCollector


def register() -> None:
    """Adds ``"dask"`` to TorchRL's collector backends (idempotent; TorchRL must be importable)."""
    _internals.register_collector_backend(BACKEND, _collector_class)
    _internals.refuse_service_backend(BACKEND, ADVICE)
