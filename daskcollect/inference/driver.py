"""The driver's side of central inference: :class:`InferenceServers` (runs on the driver).

It starts the servers (:class:`~daskcollect.inference.worker.InferenceActor`)
on workers that declare ``inference_resources``, hands each collector a client
of one of them, and sends them the driver's weights: with central inference,
only the servers hold the policy. A server's worker that leaves is learned
from the scheduler's worker events (:mod:`daskcollect.membership`), and the
server is started again elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
from distributed import Client, Variable, wait

from daskcollect import _internals
from daskcollect.deploy.workers import eligible_workers
from daskcollect.errors import CollectorTimeoutError, NotEnoughWorkersError
from daskcollect.inference.options import InferenceOptions
from daskcollect.inference.transport import DaskInferenceClient
from daskcollect.inference.worker import InferenceActor, ServerSpec
from daskcollect.settings import Settings

logger = logging.getLogger(__name__)

SERVER_KEY_PREFIX = "daskcollect-inference-"


@dataclass(frozen=True)
class Served:
    """One running server: its worker, name (the actor's key), future and actor handle."""

    address: str
    name: str
    future: Any
    actor: Any


class InferenceServers:
    """The driver's inference servers: started on eligible workers, fed weights, replaced, closed.

    A watcher thread wakes when the scheduler removes a server's worker
    (:class:`~daskcollect.membership.driver.ClusterEvents`). A server whose worker is gone is started again on another
    eligible worker (one hosting no collector if there is one) with the
    driver's latest weights and version, and the new route is written to the
    Dask ``Variable`` :attr:`group`, where the collectors' clients find it and
    send their waiting requests again. If no eligible worker appears within
    ``timeouts.workers``, the variable says so and the clients fail their
    requests with :class:`InferenceServerLostError`.

    Args:
        client: The collection's ``Client``.
        settings: The validated settings (timeouts).
        options: The validated ``inference_*`` keywords.
        policy: The policy module they serve.
        events: The collection's worker events.
    """

    def __init__(
        self, client: Client, settings: Settings, options: InferenceOptions, policy: Any, events: Any
    ):
        self.client, self.settings, self.options, self.events = client, settings, options, events
        self._policy = cloudpickle.dumps(policy)
        self._in_keys, self._out_keys = list(policy.in_keys), list(policy.out_keys)
        #: The Dask Variable with the servers' routes; also their names' prefix.
        self.group = f"{SERVER_KEY_PREFIX}{uuid.uuid4().hex[:8]}"
        self.servers: list[Served] = []
        #: The servers' workers, where the pool places no collector (shared with it).
        self.reserved: set[str] = set()
        #: The collectors' workers, avoided when placing a replacement (set by the engine).
        self.hosting: Callable[[], set[str]] = set
        self.replaced = [0] * options.workers
        self.failure: str | None = None
        self._weights: Any = None
        self._version = 0
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._wake = threading.Event()  # set when a server's worker leaves, and at close
        self._gone: set[str] = set()  # the servers' workers the scheduler removed
        self._watcher: threading.Thread | None = None
        self._unwatch = events.on_leave(self._worker_left)
        self._routes = Variable(self.group, client=client)

    @property
    def addresses(self) -> set[str]:
        return {served.address for served in self.servers}

    def start(self) -> None:
        """Starts ``options.workers`` servers, one per eligible worker (bounded), and their watcher.

        Raises:
            NotEnoughWorkersError: If too few workers declare the resources in time.
            CollectorTimeoutError: If a server is not up within ``timeouts.actor-start``.
        """
        n, resources, timeouts = self.options.workers, self.options.resources, self.settings.timeouts
        found: list[str] = []

        def enough() -> bool:
            found[:] = eligible_workers(self.client, resources, timeouts.connect)
            return len(found) >= n

        self.events.wait_until(
            enough,
            timeouts.workers,
            fail=lambda: NotEnoughWorkersError(
                f"inference_workers={n} needs {n} workers with resources {dict(resources or {})}; "
                f"{len(found)} found within {timeouts.workers:g}s. Start workers with "
                '`dask worker --resources "GPU=1"` (or your jobqueue partition\'s), or lower inference_workers.',
                needed=n,
                found=len(found),
            ),
        )
        # Workers that declare the resources go to the servers first; the rest host the collectors.
        self.reserved.update(found[:n])
        self.servers = self._await([self._launch(i, address) for i, address in enumerate(found[:n])])
        self._publish()
        self._watcher = threading.Thread(target=self._watch, name="daskcollect-inference-watch", daemon=True)
        self._watcher.start()

    def _launch(self, slot: int, address: str) -> tuple[str, str, Any]:
        """Submits server ``slot``'s actor on ``address``, with the latest weights if any were sent."""
        generation = self.replaced[slot]
        name = f"{self.group}-{slot}" + (f".{generation}" if generation else "")
        options = self.options
        spec = ServerSpec(
            name, options.max_batch_size, options.device, options.track_policy_version,
            options.torch_threads, self._version,
        )  # fmt: skip
        policy = self.client.scatter(self._policy, workers=[address], hash=False)
        weights = None
        if self._weights is not None:
            weights = self.client.scatter(self._weights, workers=[address], hash=False)
        future = self.client.submit(
            InferenceActor, spec, policy, weights, actor=True, workers=[address],
            allow_other_workers=False, pure=False, key=name,
        )  # fmt: skip
        return address, name, future

    def _await(self, launched: list[tuple[str, str, Any]]) -> list[Served]:
        """The launched servers once up (bounded by ``timeouts.actor-start``).

        Raises:
            CollectorTimeoutError: If one is not up in time (all are cancelled).
        """
        timeout = self.settings.timeouts.actor_start
        with self.client.as_current():
            wait([f for _, _, f in launched], timeout=timeout)
        late = [name for _, name, f in launched if f.status != "finished"]
        if late:
            errors = [f.exception() for _, _, f in launched if f.status == "error"]
            self.client.cancel([f for _, _, f in launched])
            if errors:
                raise errors[0]
            raise CollectorTimeoutError(
                f"Inference servers {late} were not up within {timeout:g}s: building the policy "
                "on their workers is slow or stuck. Raise daskcollect.timeouts.actor-start.",
            )
        with self.client.as_current():
            return [Served(address, name, f, f.result()) for address, name, f in launched]

    def _publish(self) -> None:
        routes = [[served.address, served.name] for served in self.servers]
        self._routes.set({"routes": routes, "failed": self.failure}, timeout=self.settings.timeouts.call)

    def _worker_left(self, address: str) -> None:
        """A worker was removed (event loop): wakes the watcher if it hosted a server."""
        if address in self.addresses:
            self._gone.add(address)
            self._wake.set()

    def _watch(self) -> None:
        while not self._closed.is_set():
            if not self._wake.wait(self.settings.timeouts.workers):
                continue  # bounded: nothing left; wait again
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self._check()
            except Exception:  # the next event tries again: a watcher that dies replaces nothing
                logger.exception("Replacing an inference server failed")

    def _check(self) -> None:
        if self.failure is not None:
            return
        for slot, served in enumerate(list(self.servers)):
            if served.address in self._gone or served.future.status in ("error", "lost", "cancelled"):
                self._replace(slot, served)
                self._gone.discard(served.address)

    def _replace(self, slot: int, lost: Served) -> None:
        """Starts server ``slot`` again elsewhere and publishes its route; or publishes the failure."""
        logger.warning("Inference server %s on %s is lost; starting it again", lost.name, lost.address)
        timeouts = self.settings.timeouts
        self.reserved.discard(lost.address)
        free: list[str] = []

        def found() -> bool:
            live = eligible_workers(self.client, self.options.resources, timeouts.connect)
            free[:] = sorted(set(live) - self.reserved - {lost.address})
            return bool(free) or self._closed.is_set()

        self.events.wait_until(found, timeouts.workers)
        if not free:
            self.failure = (
                f"the inference server {lost.name} on {lost.address} is lost and no worker with resources "
                f"{dict(self.options.resources or {})} was free to replace it within {timeouts.workers:g}s"
            )
            logger.error("%s", self.failure)
            self._publish()
            return
        hosting = self.hosting()
        address = next((address for address in free if address not in hosting), free[0])
        with self._lock:
            self.reserved.add(address)
            self.replaced[slot] += 1
            try:
                (served,) = self._await([self._launch(slot, address)])
            except Exception:
                self.reserved.discard(address)
                raise
            self.servers[slot] = served
            with contextlib.suppress(Exception):
                self.client.cancel([lost.future])
            self._publish()
        logger.warning("Inference server %s replaced by %s on %s", lost.name, served.name, address)

    def clients(self, n: int) -> list[DaskInferenceClient]:
        """One client per collector, spreading the collectors evenly over the servers."""
        timeout = self.settings.timeouts.rollout
        inputs = [*self._in_keys, _internals.inference_stamp_key()]
        outputs = [*self._out_keys, *(["policy_version"] if self.options.track_policy_version else [])]
        routes = [(served.address, served.name) for served in self.servers]
        return [DaskInferenceClient(self.group, i, routes, timeout, inputs, outputs) for i in range(n)]

    def policies(self, n: int) -> list[Any]:
        """One policy per collector: TorchRL's ``PolicyClientModule`` over a client of one server,
        spreading the collectors evenly over the servers, with at most ``max_in_flight`` requests each."""
        from torchrl.modules.inference_server import PolicyClientModule

        in_keys, out_keys, cap = list(self._in_keys), list(self._out_keys), self.options.max_in_flight
        return [
            PolicyClientModule(c, in_keys=in_keys, out_keys=out_keys, max_inflight=cap)
            for c in self.clients(n)
        ]

    def load_weights(self, weights: Any) -> None:
        """Sends ``weights`` to every server and waits (bounded) until each serves them; a replacement
        started later gets them too."""
        with self._lock:
            self._weights, self._version = weights.detach().clone(), self._version + 1
            calls = [served.actor.load_weights(weights) for served in self.servers]
            for call in calls:
                call.result(timeout=self.settings.timeouts.weights)

    def stats(self) -> list[dict[str, Any]]:
        """Each server's worker, replacements and TorchRL's statistics (bounded; a silent server reports
        none)."""
        calls = [(slot, served, served.actor.stats()) for slot, served in enumerate(self.servers)]
        out = []
        for slot, served, call in calls:
            with contextlib.suppress(Exception):
                stats = call.result(timeout=self.settings.timeouts.call)
                out.append(
                    {"worker": served.address, "name": served.name, "replaced": self.replaced[slot], **stats}
                )
        return out

    def close(self, timeout: float) -> None:
        """Stops the watcher and the servers, deletes their actors and routes (bounded, idempotent)."""
        self._closed.set()
        self._wake.set()
        self._unwatch()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout)
        with self._lock:
            calls = []
            for served in self.servers:
                with contextlib.suppress(Exception):
                    calls.append(served.actor.close())
            for call in calls:
                with contextlib.suppress(Exception):
                    call.result(timeout=timeout)
            with contextlib.suppress(Exception):
                self.client.cancel([served.future for served in self.servers])
            with contextlib.suppress(Exception):
                self._routes.delete()
            self.servers = []
