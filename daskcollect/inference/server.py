"""Central inference: TorchRL's ``InferenceServer`` in Dask actors, placed by the workers' resources.

:class:`InferenceActor` hosts one ``InferenceServer`` (its serving thread
batches the requests of every collector that asks it) behind a
:class:`~daskcollect.inference.transport.ServerTransport`. :class:`InferenceServers`
is the driver's side: it starts the actors on workers that declare
``inference_resources``, hands each collector a client of one of them, and
sends them the driver's weights: with central inference, only the servers
hold the policy.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, replace
from typing import Any

import cloudpickle
import torch
from distributed import Client, get_worker, wait

from daskcollect import _internals
from daskcollect.cluster import eligible_workers
from daskcollect.errors import CollectorTimeoutError, NotEnoughWorkersError
from daskcollect.inference import transport
from daskcollect.inference.options import InferenceOptions
from daskcollect.inference.transport import SERVING, DaskInferenceClient, ServerTransport
from daskcollect.polling import poll_until
from daskcollect.settings import Settings

logger = logging.getLogger(__name__)

SERVER_KEY_PREFIX = "daskcollect-inference-"


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
        spec: Its name and batching.
        policy: The cloudpickled policy module.
    """

    def __init__(self, spec: ServerSpec, policy: bytes):
        from torchrl.modules.inference_server import InferenceServer

        worker = get_worker()
        transport.install(worker)
        self.spec = spec
        # The forward passes get the threads the worker declares (dask worker --nthreads), not the
        # one a collector's worker gets (daskcollect.worker.torch-threads).
        self._threads = torch.get_num_threads()
        torch.set_num_threads(spec.torch_threads or worker.state.nthreads)
        model = cloudpickle.loads(policy)
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
        from tensordict import TensorDict

        def load(model: Any) -> None:
            TensorDict.from_module(model).data.update_(weights.to(self.spec.device or "cpu"))

        self.server.update_model(load)
        return self.server.policy_version

    async def stats(self) -> dict[str, Any]:
        """TorchRL's server statistics: requests, batch sizes, queue and forward times (answers at once)."""
        return self.server.stats()

    def close(self) -> None:
        SERVING.pop(self.spec.name, None)
        self.server.shutdown()
        torch.set_num_threads(self._threads)


class InferenceServers:
    """The driver's inference servers: started on eligible workers, fed weights, closed.

    Args:
        client: The collection's ``Client``.
        settings: The validated settings (timeouts).
        options: The validated ``inference_*`` keywords.
        policy: The policy module they serve.
    """

    def __init__(self, client: Client, settings: Settings, options: InferenceOptions, policy: Any):
        self.client, self.settings, self.options = client, settings, options
        self._policy = cloudpickle.dumps(policy)
        self._in_keys, self._out_keys = list(policy.in_keys), list(policy.out_keys)
        self._token = uuid.uuid4().hex[:8]
        self.servers: list[tuple[str, str, Any, Any]] = []  # (address, name, future, actor)

    @property
    def addresses(self) -> set[str]:
        return {address for address, _, _, _ in self.servers}

    def start(self) -> None:
        """Starts ``options.workers`` servers, one per eligible worker (bounded).

        Raises:
            NotEnoughWorkersError: If too few workers declare the resources in time.
            CollectorTimeoutError: If a server is not up within ``timeouts.actor-start``.
        """
        n, resources, timeouts = self.options.workers, self.options.resources, self.settings.timeouts
        found: list[str] = []

        def enough() -> bool:
            found[:] = eligible_workers(self.client, resources, timeouts.connect)
            return len(found) >= n

        poll_until(
            enough,
            timeouts.workers,
            interval=0.2,
            fail=lambda: NotEnoughWorkersError(
                f"inference_workers={n} needs {n} workers with resources {dict(resources or {})}; "
                f"{len(found)} found within {timeouts.workers:g}s. Start workers with "
                '`dask worker --resources "GPU=1"` (or your jobqueue partition\'s), or lower inference_workers.',
                needed=n,
                found=len(found),
            ),
        )
        # Workers that declare the resources go to the servers first; the rest host the collectors.
        spec = ServerSpec(
            "", self.options.max_batch_size, self.options.device, self.options.track_policy_version
        )
        policy = self.client.scatter(self._policy, workers=found[:n], broadcast=True, hash=False)
        futures = []
        for i, address in enumerate(found[:n]):
            name = f"{SERVER_KEY_PREFIX}{self._token}-{i}"
            futures.append(
                (address, name, self.client.submit(
                    InferenceActor, replace(spec, name=name), policy, actor=True, workers=[address],
                    allow_other_workers=False, pure=False, key=name,
                ))
            )  # fmt: skip
        with self.client.as_current():
            wait([f for _, _, f in futures], timeout=timeouts.actor_start)
        late = [name for _, name, f in futures if f.status != "finished"]
        if late:
            errors = [f.exception() for _, _, f in futures if f.status == "error"]
            self.client.cancel([f for _, _, f in futures])
            if errors:
                raise errors[0]
            raise CollectorTimeoutError(
                f"Inference servers {late} were not up within {timeouts.actor_start:g}s: building the policy "
                "on their workers is slow or stuck. Raise daskcollect.timeouts.actor-start.",
            )
        with self.client.as_current():
            self.servers = [(a, name, f, f.result()) for a, name, f in futures]

    def clients(self, n: int) -> list[DaskInferenceClient]:
        """One client per collector, spreading the collectors evenly over the servers."""
        timeout = self.settings.timeouts.rollout
        inputs = [*self._in_keys, _internals.inference_stamp_key()]
        outputs = [*self._out_keys, *(["policy_version"] if self.options.track_policy_version else [])]
        return [
            DaskInferenceClient(*self.servers[i % len(self.servers)][:2], timeout, inputs, outputs)
            for i in range(n)
        ]

    def policies(self, n: int) -> list[Any]:
        """One policy per collector: TorchRL's ``PolicyClientModule`` over a client of one server,
        spreading the collectors evenly over the servers."""
        from torchrl.modules.inference_server import PolicyClientModule

        in_keys, out_keys = list(self._in_keys), list(self._out_keys)
        return [PolicyClientModule(c, in_keys=in_keys, out_keys=out_keys) for c in self.clients(n)]

    def load_weights(self, weights: Any) -> None:
        """Sends ``weights`` to every server and waits (bounded) until each serves them."""
        calls = [actor.load_weights(weights) for _, _, _, actor in self.servers]
        for call in calls:
            call.result(timeout=self.settings.timeouts.weights)

    def stats(self) -> list[dict[str, Any]]:
        """Each server's worker and TorchRL's statistics (bounded; a silent server reports none)."""
        calls = [(address, name, actor.stats()) for address, name, _, actor in self.servers]
        out = []
        for address, name, call in calls:
            with contextlib.suppress(Exception):
                out.append(
                    {"worker": address, "name": name, **call.result(timeout=self.settings.timeouts.call)}
                )
        return out

    def close(self, timeout: float) -> None:
        """Stops the servers and deletes their actors (bounded, idempotent)."""
        calls = []
        for _, _, _, actor in self.servers:
            with contextlib.suppress(Exception):
                calls.append(actor.close())
        for call in calls:
            with contextlib.suppress(Exception):
                call.result(timeout=timeout)
        with contextlib.suppress(Exception):
            self.client.cancel([f for _, _, f, _ in self.servers])
        self.servers = []
