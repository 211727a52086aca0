"""The one owner of a collection's resources: opened in order, closed in reverse (runs on the driver).

:meth:`Session.open` opens what a collection holds, each registered on one
``contextlib.ExitStack`` as it opens: our ``Client`` (and the private cluster),
the worker setup, the scheduler plugins' leases, the worker events, the
inference servers, the hold against the driver's death, the engine (the
actors, the weights' transports, the ledger), the weight senders, the cores
left to collectors on this host, and the reporter. :meth:`Session.close` closes
them in the reverse order, bounded; a failed open closes what had opened.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any

import torch
from dask.system import CPU_COUNT

from daskcollect.collection.engine import Engine
from daskcollect.collection.iteration import Progress
from daskcollect.collection.spec import CollectionSpec
from daskcollect.deploy.handle import ClusterHandle, connect
from daskcollect.deploy.jobs import BatchJobs
from daskcollect.deploy.workers import eligible_workers, wait_for_workers
from daskcollect.errors import NotEnoughWorkersError
from daskcollect.inference.driver import InferenceServers
from daskcollect.leases.driver import Lease
from daskcollect.membership.driver import ClusterEvents
from daskcollect.monitoring.cost import WorkerTime
from daskcollect.monitoring.driver import Reporter, install_monitor
from daskcollect.reattach import driver as reattach
from daskcollect.retirement.driver import install_retirement_hook
from daskcollect.scaling.driver import Demand, install_demand_scaling
from daskcollect.settings import Settings
from daskcollect.streams.serialization import register_serializers
from daskcollect.weights.scheme import start_senders
from daskcollect.worker.plugin import WorkerSetup
from daskcollect.worker.signals import NANNY_PLUGIN_PREFIX, NannySignals


class Session:
    """A collection's resources.

    Args:
        spec: The validated collection spec.
        settings: The validated settings.
        policy: The driver's policy (``None``: the collectors build their own).
        logger: A TorchRL logger for the reporter, or ``None``.
        owner: The collector: TorchRL's weight senders are initialised on it.
        publish: How the senders write weights (the collector's route).
        refresh: How ``update_after_each_batch`` refreshes are pushed.
        snapshot: The collector's stats snapshot, for the reporter.
        resumed_run: The run named by ``resume_from``'s checkpoint, or ``None``.
    """

    def __init__(
        self,
        spec: CollectionSpec,
        settings: Settings,
        policy: Any,
        logger: Any,
        *,
        owner: Any,
        publish: Callable[[Any, list[int] | None], None],
        refresh: Callable[[list], None],
        snapshot: Callable[[], dict],
        resumed_run: str | None = None,
    ):
        self.spec, self.settings, self.policy, self.logger = spec, settings, policy, logger
        self._owner, self._publish, self._refresh, self._snapshot = owner, publish, refresh, snapshot
        self._resumed_run = resumed_run
        self._stack = contextlib.ExitStack()
        self._timeout = settings.timeouts.shutdown
        self.handle: ClusterHandle | None = None
        self.events: ClusterEvents | None = None
        self.servers: InferenceServers | None = None
        self.engine: Engine | None = None
        self.reporter: Reporter | None = None
        #: What the driver yielded (TorchRL's counters, the pass, each collector's last rollout).
        self.progress = Progress()
        self.demand = Demand()
        self.worker_time = WorkerTime(spec.cluster.worker_resources)

    # --- opening --------------------------------------------------------------
    def open(self) -> None:
        """Opens everything, in order; closes what opened if one step fails."""
        with self._stack as stack:
            self._open(stack)
            self._stack = stack.pop_all()  # opened: kept for close()

    def _open(self, stack: contextlib.ExitStack) -> None:
        spec, settings = self.spec, self.settings
        n = spec.num_collectors
        if n is None and spec.cluster.client is None and spec.cluster.scheduler_file is None:
            n = CPU_COUNT
        register_serializers()
        servers = spec.inference.workers if spec.inference is not None else 0
        self.handle = connect(spec.cluster, n_workers=(n or 1) + servers, settings=settings)
        stack.callback(lambda: self.handle.close(self._timeout))  # and the worker plugins below with it
        client = self.handle.client
        # While it waits for workers, the driver says which batch jobs have not started, twice a wait.
        report_every = min(10.0, settings.timeouts.workers / 2)
        self.jobs = BatchJobs(getattr(self.handle.given, "cluster", None), report_every)
        setup = WorkerSetup(spec.cluster.worker_env, settings.worker)
        self.handle.register_plugin(setup, name=f"daskcollect-{setup.token[:12]}")
        if settings.worker.retire_signals:
            signals = NannySignals(settings.worker.retire_signals, setup.token)
            self.handle.register_plugin(signals, name=f"{NANNY_PLUGIN_PREFIX}{setup.token[:12]}")
        self._hold(stack, install_retirement_hook(client, settings.timeouts.retire))
        if settings.scale_to_demand:
            self._hold(stack, install_demand_scaling(client, settings.timeouts.call))
        self._hold(stack, install_monitor(client, settings.history, settings.timeouts.call))
        self.events = ClusterEvents(client, settings.timeouts.call)
        stack.callback(self.events.close)
        if spec.inference is not None:
            self.servers = InferenceServers(client, settings, spec.inference, self.policy, self.events)
            stack.callback(lambda: self.servers.close(self._timeout))
            self.servers.start()
        n = self._count(n)
        recipes = spec.recipes(n, self.servers.policies(n) if self.servers is not None else None)
        held, run, claimed = reattach.hold(self.handle, settings, self._resumed_run)
        self._hold(stack, held)
        module = self.policy if isinstance(self.policy, torch.nn.Module) else None
        self.engine = Engine(client, spec, settings, n, recipes, module, push=self._refresh, run=run)
        stack.callback(lambda: self.engine.close(self._timeout))
        self.engine.watch(self.events)
        self.engine.explain = self.jobs.explain
        self.engine.on_forget.append(self.progress.yielded.forget)
        self.engine.serve_from(self.servers)
        start_senders(spec.weights.schemes, self._owner, self._publish)
        stack.callback(self._stop_senders)
        if claimed is not None:
            self.engine.adopt(list(claimed.members))
        else:
            with self.jobs.reporting():
                self.engine.start()
        threads = share_cores(settings.driver_torch_threads, self.engine, self.handle)
        if threads is not None:
            stack.callback(torch.set_num_threads, threads)
        report_id = f"{socket.gethostname()}-{os.getpid()}-{id(self._owner) & 0xFFFFFF:06x}"
        self.reporter = Reporter(
            client, report_id, settings.report_interval, settings.timeouts.call, self.logger
        )
        stack.callback(lambda: self.reporter.close(self._snapshot))

    @staticmethod
    def _hold(stack: contextlib.ExitStack, lease: Lease | None) -> None:
        if lease is not None:
            stack.callback(lease.release)  # the last collection on the scheduler removes the plugin

    def _count(self, n: int | None) -> int:
        """The number of collectors: ``n``, or one per eligible worker not reserved for inference."""
        spec, settings = self.spec, self.settings
        if n is not None:
            return n
        reserved = self.servers.addresses if self.servers is not None else set()
        resources, client = spec.cluster.worker_resources, self.handle.client
        try:
            with self.jobs.reporting():
                wait_for_workers(client, 1 + len(reserved), resources, settings.timeouts.workers)
        except NotEnoughWorkersError as error:
            raise self.jobs.explain(error) from None
        n = len(set(eligible_workers(client, resources, settings.timeouts.connect)) - reserved)
        spec.check_count(n)  # a count known before connecting was checked then
        return n

    def cost_and_demand(self, frames: int, collectors: list[dict[str, Any]]) -> dict[str, Any]:
        """The stats of :mod:`daskcollect.monitoring.cost`, of the batch jobs not started yet
        (:mod:`daskcollect.deploy.jobs`), and, if on, of :mod:`daskcollect.scaling`."""
        self.worker_time.seen(c["collector_id"] for c in collectors)
        out = self.worker_time.as_dict(frames)
        if self.jobs.batch:
            out["jobs_waiting"] = self.jobs.described()
        if self.settings.scale_to_demand:
            # A set num_collectors wants its own workers; following the cluster, the learner decides.
            fixed = None if self.spec.follow or self.engine is None else self.engine.requested
            out.update(self.demand.as_dict(collectors, fixed))
        return out

    def _stop_senders(self) -> None:
        for scheme in (self.spec.weights.schemes or {}).values():
            scheme.shutdown()

    # --- closing --------------------------------------------------------------
    def close(self, timeout: float) -> None:
        """Closes everything opened, in reverse order, each bounded by ``timeout`` (idempotent)."""
        self._timeout = timeout
        self._stack.close()

    def sizes(self) -> dict[str, int]:
        """How many entries each per-collector structure holds on the driver (a bound check)."""
        return {**self.engine.sizes(), "yielded": len(self.progress.yielded.last)} if self.engine else {}

    @property
    def client(self) -> Any:
        """The user's ``Client`` where one was given, else ours (``None`` before open)."""
        if self.handle is None:
            return None
        return self.handle.given or self.handle.client


def share_cores(setting: int | str | None, engine: Engine, handle: ClusterHandle) -> int | None:
    """Leaves the cores of collectors on this host to them, as TorchRL's multiprocess collectors do.

    With ``daskcollect.driver.torch-threads: auto``, the driver's torch
    threads become the cores less the collectors on this host (at least 1)
    until shutdown: a learner's thread pool on cores busy with rollouts
    spins and slows down (DQN's gradient steps ran 2-3 times slower).

    Returns:
        The driver's torch threads before, to restore at shutdown; ``None``
        if nothing changed.
    """
    if setting is None:
        return None
    if setting == "auto":
        slots = engine.pool.slots
        if engine.router.probe is not None:
            here = sum(s.on_driver_host for s in slots)
        else:  # no probe: only a private cluster is known to be on this host
            here = len(slots) if handle.cluster is not None else 0
        if not here:
            return None
        threads = max(1, torch.get_num_threads() - here)
    else:
        threads = int(setting)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    return before
