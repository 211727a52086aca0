"""The server's side of central inference: :class:`InferenceActor` (runs on a worker).

It hosts one TorchRL ``InferenceServer`` (its serving thread batches the
requests of every collector that asks it) behind a
:class:`~daskcollect.inference.transport.ServerTransport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch
from distributed import get_worker

from daskcollect import _internals
from daskcollect.inference import transport
from daskcollect.inference.transport import SERVING, ServerTransport


@dataclass(frozen=True)
class ServerSpec:
    """What one inference actor needs besides the policy."""

    name: str
    max_batch_size: int
    device: str | None
    track_policy_version: bool
    torch_threads: int | None = None
    policy_version: int = 0


class InferenceActor:
    """One ``InferenceServer`` in a Dask worker (created with ``actor=True``).

    Args:
        spec: Its name, batching and the version of ``weights``.
        policy: The cloudpickled policy module.
        weights: The weights to serve instead of the policy's own (a
            replacement server gets the driver's latest), or ``None``.
    """

    def __init__(self, spec: ServerSpec, policy: bytes, weights: Any = None):
        from torchrl.modules.inference_server import InferenceServer

        worker = get_worker()
        transport.install(worker)
        self.spec = spec
        # The forward passes get the threads the worker declares (dask worker --nthreads), not the
        # one a collector's worker gets (daskcollect.worker.torch-threads).
        self._threads = torch.get_num_threads()
        torch.set_num_threads(spec.torch_threads or _internals.worker_nthreads(worker))
        model = cloudpickle.loads(policy)
        if weights is not None:
            _load(model, weights, "cpu")
        if spec.device is not None:
            model = model.to(spec.device)
        self.transport = ServerTransport()
        self.server = InferenceServer(
            model,
            self.transport,
            max_batch_size=spec.max_batch_size,
            policy_device=spec.device,
            output_device="cpu" if spec.device is not None else None,  # answers leave the worker on CPU
            policy_version=spec.policy_version,
            policy_version_key="policy_version" if spec.track_policy_version else None,
        )
        SERVING[spec.name] = self.transport
        self.server.start()

    def load_weights(self, weights: Any) -> int:
        """Copies ``weights`` into the served policy between batches; returns the new version."""
        self.server.update_model(lambda model: _load(model, weights, self.spec.device or "cpu"))
        return self.server.policy_version

    async def stats(self) -> dict[str, Any]:
        """TorchRL's server statistics (requests, batch sizes, queue and forward times), the requests
        waiting and the collectors' action latency (answers at once)."""
        return {**self.server.stats(), **self.transport.stats()}

    def close(self) -> None:
        SERVING.pop(self.spec.name, None)
        self.server.shutdown()
        get_worker().loop.add_callback(self.transport.close)
        torch.set_num_threads(self._threads)


def _load(model: Any, weights: Any, device: str) -> None:
    from tensordict import TensorDict

    TensorDict.from_module(model).data.update_(weights.to(device))
