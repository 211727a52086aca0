"""Turns ``client`` / ``scheduler_file`` / nothing into a Client we own.

daskcollect always talks to the scheduler through its own
``Client(direct_to_workers=True)``, so that actor calls and batches go
straight to the workers and a user's Client is never reconfigured or closed.
With nothing given, it starts a private loopback ``LocalCluster`` and closes
it at shutdown. On a user's cluster, what daskcollect registers there goes when
its handle closes, and a collector or buffer still open at interpreter exit is
closed then (:func:`close_at_exit`), before Dask closes its clients.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import dask.config
from distributed import Client, LocalCluster, Nanny, SpecCluster
from distributed.comm import connect as comm_connect
from distributed.security import Security

from daskcollect import _internals
from daskcollect.errors import ClusterConnectionError, ConfigurationError, NotEnoughWorkersError
from daskcollect.main_guard import check_main_guard
from daskcollect.options import ClusterOptions
from daskcollect.polling import poll_until
from daskcollect.py_modules import ship
from daskcollect.scheduler_process import SchedulerProcess
from daskcollect.settings import Settings

logger = logging.getLogger(__name__)

#: The topic of the close barrier (see :meth:`ClusterHandle.close`).
DRAINED_TOPIC = "daskcollect-drained"


@dataclass
class ClusterHandle:
    """Our Client, and the private cluster when we started one.

    Attributes:
        client: Our own ``Client(direct_to_workers=True)``, closed with the
            collection; a user's ``Client`` is never closed nor changed.
        cluster: The private cluster (a ``LocalCluster``, or its layout as a ``SpecCluster``), or ``None`` for a user's cluster.
        given: The user's ``Client``, where one was given.
        plugins: The worker plugins registered through :meth:`register_plugin`,
            removed from a user's cluster at :meth:`close`.
    """

    client: Client
    cluster: SpecCluster | None = None
    given: Client | None = None
    plugins: list[str] = field(default_factory=list)
    _drained: threading.Event = field(default_factory=threading.Event, repr=False)
    _token: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)

    def _on_event(self, event: tuple) -> None:
        if event[1] == self._token:
            self._drained.set()

    def _drain(self, timeout: float) -> None:
        """Waits (bounded) until the scheduler has sent us everything it queued for us.

        Cancelling our actors makes the scheduler queue a report to every
        client; closing ours before that report is written leaves a
        ``CommClosedError`` traceback in the scheduler's log. A subscription
        travels on the same ordered stream as the cancel, so the first event
        of a fresh topic that comes back was queued after the report.
        """
        topic = f"{DRAINED_TOPIC}-{self._token}"
        with contextlib.suppress(Exception):
            self.client.subscribe_topic(topic, self._on_event)

            def echoed() -> bool:
                self.client.log_event(topic, self._token)
                return self._drained.wait(0.05)

            poll_until(echoed, timeout, interval=0.0, fail=TimeoutError)
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(topic)

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:  # no dashboard (bokeh missing or disabled)
            return None

    def register_plugin(self, plugin: Any, name: str) -> None:
        """Registers a worker plugin, to be removed when this handle closes."""
        self.client.register_plugin(plugin, name=name)
        self.plugins.append(name)

    def adopt_plugins(self, names: list[str]) -> None:
        """Worker plugins another driver registered, removed at :meth:`close` after ours."""
        self.plugins[:0] = [n for n in names if n not in self.plugins]

    def _unregister_plugins(self) -> None:
        for name in reversed(self.plugins):
            try:
                self.client.unregister_worker_plugin(name)
            except Exception as exc:  # the scheduler is gone: there is nothing left to undo
                logger.debug("could not remove worker plugin %s (%s)", name, exc)
        self.plugins.clear()

    def close(self, timeout: float) -> None:
        """Closes our Client and the private cluster; a user's cluster stays, without our plugins."""
        if self.cluster is None:
            self._unregister_plugins()
            self._drain(min(timeout, 5.0))
        with contextlib.suppress(Exception):
            self.client.close(timeout=timeout)
        # A Client that closed itself after losing the scheduler skipped stopping its loop above.
        _internals.stop_loop(self.client)
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close(timeout=timeout)


def connect(options: ClusterOptions, n_workers: int, settings: Settings) -> ClusterHandle:
    """Connects to the cluster that ``options`` names, or starts a private one.

    Args:
        options: Where to run.
        n_workers: Workers of a private ``LocalCluster``.
        settings: The validated ``daskcollect`` settings.

    Raises:
        ClusterConnectionError: If the scheduler cannot be reached within
            ``daskcollect.timeouts.connect``.
    """
    timeout = settings.timeouts.connect
    target = options.client
    if target is None and options.scheduler_file is None:
        check_main_guard()
        # The nanny hands the current dask.config to the worker processes.
        with dask.config.set(settings.local_cluster_config):
            cluster = _local_cluster(options, n_workers, settings)
        try:
            client = Client(cluster, direct_to_workers=True, set_as_default=False, timeout=timeout)
        except (OSError, TimeoutError) as exc:
            cluster.close()
            raise ClusterConnectionError(
                f"The private LocalCluster's scheduler did not answer within "
                f"{timeout:g}s ({type(exc).__name__}: {exc}); starting {n_workers} worker processes "
                "kept it too busy. Ask for fewer collectors, raise daskcollect.timeouts.connect, or "
                "pass client= a cluster started on its own.",
                address=cluster.scheduler_address,
            ) from exc
        except BaseException:
            cluster.close()
            raise
        handle = ClusterHandle(client, cluster)
    else:
        handle = _connect_existing(options, timeout)
    if options.py_modules:
        try:
            ship(handle, options.py_modules)
        except BaseException:
            handle.close(timeout)
            raise
    return handle


_left_open: list[weakref.WeakMethod] = []


def close_at_exit(close: Callable[[], Any]) -> None:
    """Calls ``close`` (a bound ``shutdown`` or ``close``) at interpreter exit if its object is still alive.

    A script that ends without closing its collector would otherwise leave its
    worker plugins on a user's cluster, its shared-memory files on this host and
    its envs running until the scheduler notices the client is gone. The handler
    is registered after ``distributed``'s own (imported above), so it runs first,
    while our Client still works.
    """
    _left_open[:] = [ref for ref in _left_open if ref() is not None]
    _left_open.append(weakref.WeakMethod(close))


@atexit.register
def _close_left_open() -> None:
    for ref in reversed(_left_open):
        close = ref()
        if close is not None:
            with contextlib.suppress(Exception):
                close()


#: The nanny's own process monitors, which a private cluster's nannies drop.
NANNY_MONITORS = ("monitor", "tick", "ticks", "shift_counters")


class DriverNanny(Nanny):
    """A private cluster's nanny, without its own process monitors.

    Every nanny of a private ``LocalCluster`` runs in the driver's process, on
    its event loop. Each would sample that same process (psutil) and time that
    same loop every few seconds: at 16 workers, 9 to 17 of the 26 to 32 ms of
    CPU a second that an idle private cluster cost the driver
    (docs/benchmarks.md, P7). The nanny's own work (starting, restarting and
    watching its worker process) is untouched, and each worker still monitors
    its own process.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _internals.drop_periodic_callbacks(self, NANNY_MONITORS)


class PrivateCluster(SpecCluster):
    """A ``SpecCluster`` that stops its event loop when its start fails (``SpecCluster`` closes what it
    started then, but leaves the loop's thread running for the life of the process)."""

    def __init__(self, *args: Any, **kwargs: Any):
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            _internals.stop_loop(self)
            raise


def _private_cluster(kwargs: dict[str, Any], scheduler_timeout: float) -> SpecCluster:
    """A ``LocalCluster``'s layout from Dask's public ``SpecCluster`` specs, its scheduler in a child
    process (:class:`SchedulerProcess`): the same scheduler and nanny options that ``LocalCluster``
    would build from ``kwargs`` (its keywords, as :func:`_local_cluster` gives them)."""
    security = kwargs["security"]
    if security is None:
        security = Security()
    elif security is True:
        security = Security.temporary()
    protocol = "tls://" if security.require_encryption else "tcp://"
    dashboard = kwargs["dashboard_address"]
    scheduler = {
        "cls": SchedulerProcess,
        "options": dict(
            host=kwargs["host"], security=security, protocol=protocol, dashboard=dashboard is not None,
            dashboard_address=dashboard, timeout=scheduler_timeout,
        ),
    }  # fmt: skip
    worker = {
        "cls": kwargs["worker_class"],
        "options": dict(
            host=kwargs["host"], nthreads=kwargs["threads_per_worker"], memory_limit=kwargs["memory_limit"],
            resources=kwargs["resources"], security=security, protocol=protocol, dashboard=False,
            silence_logs=logging.WARN,
        ),
    }  # fmt: skip
    return PrivateCluster(
        scheduler=scheduler,
        workers=dict.fromkeys(range(kwargs["n_workers"]), worker),
        worker=worker,
        security=security,
        silence_logs=logging.WARN,
    )


def _local_cluster(options: ClusterOptions, n_workers: int, settings: Settings) -> SpecCluster:
    kwargs: dict[str, Any] = dict(
        n_workers=n_workers,
        worker_class=DriverNanny,
        threads_per_worker=1,
        processes=True,
        host=settings.local_host,
        dashboard_address=settings.local_dashboard_address,
        memory_limit=settings.local_memory_limit,
        resources=dict(options.worker_resources) if options.worker_resources else None,
        security=options.security,
    )
    if not settings.local_scheduler_process:
        return LocalCluster(**kwargs)
    try:
        return _private_cluster(kwargs, scheduler_timeout=settings.timeouts.connect)
    except RuntimeError as exc:  # SpecCluster wraps what failed its start
        if isinstance(exc.__cause__, (ClusterConnectionError, ConfigurationError)):
            raise exc.__cause__ from None
        raise


def _connect_existing(options: ClusterOptions, timeout: float) -> ClusterHandle:
    target = options.client
    kwargs: dict[str, Any] = dict(direct_to_workers=True, set_as_default=False, timeout=timeout)
    if isinstance(target, Client):
        address = target.scheduler.address
        kwargs["security"] = options.security or target.security
        where = f"the scheduler of the given Client ({address})"
    elif isinstance(target, str):
        address = target
        kwargs["security"] = options.security
        where = f"the scheduler at {address}"
    elif target is None:
        address = _wait_for_scheduler_file(str(options.scheduler_file), timeout)
        kwargs["security"] = options.security
        where = f"the scheduler named in {options.scheduler_file}"
    else:
        raise ClusterConnectionError(
            f"client must be a distributed.Client, a scheduler address or None, got "
            f"{type(target).__name__}. Pass Client(...), 'tcp://host:8786' or nothing."
        )
    try:
        if not isinstance(target, Client):  # a given Client is connected already
            _probe(address, kwargs["security"], timeout)
        client = Client(address, **kwargs)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        if str(address).startswith("tls://") and kwargs.get("security") is None:
            hint = (
                "The scheduler speaks TLS and no certificates were given: pass "
                "security=distributed.security.Security(tls_ca_file=..., tls_client_cert=..., "
                "tls_client_key=..., require_encryption=True), or a Client built with them."
            )
        else:
            hint = (
                "Check that the scheduler is running and reachable from here (address, port, "
                "TLS settings), or raise daskcollect.timeouts.connect."
            )
        raise ClusterConnectionError(
            f"Could not connect to {where} within {timeout:g}s ({type(exc).__name__}: {exc}). {hint}",
            address=address,
        ) from exc
    return ClusterHandle(client, given=target if isinstance(target, Client) else None)


def _probe(address: str, security: Any, timeout: float) -> None:
    """Connects to ``address`` once through Dask's comm layer (TCP, TLS, any backend), then hangs up.

    An unreachable scheduler, or one that speaks TLS to a driver without
    certificates, then fails here, before a ``Client`` exists: Dask leaves a
    Client whose start failed with its event loop running until the Client is
    garbage, and its ``__del__`` may then run in the thread of another
    ``LoopRunner`` that is starting, and block it for 10 s on Dask's lock
    (the next collection after a failed connection failing at random).

    Raises:
        OSError, TimeoutError, TypeError, ValueError: What Dask's ``connect`` raises.
    """

    async def connect_once() -> None:
        args = (security or Security()).get_connection_args("client")
        comm = await comm_connect(address, timeout=timeout, **args)
        await comm.close()

    # A thread of its own: the caller may be inside a running event loop (a notebook).
    with ThreadPoolExecutor(1, thread_name_prefix="daskcollect-probe") as pool:
        pool.submit(asyncio.run, connect_once()).result()


def _wait_for_scheduler_file(path: str, timeout: float) -> str:
    """Waits (bounded) for a scheduler file to appear; its scheduler's address.

    Dask's own wait has no useful message.
    """

    def fail() -> ClusterConnectionError:
        return ClusterConnectionError(
            f"The scheduler file {path!r} did not appear within {timeout:g}s. Start the scheduler with "
            f"`dask scheduler --scheduler-file {path}` (on a filesystem this machine sees), check the "
            "path, or raise daskcollect.timeouts.connect.",
            path=path,
        )

    def address() -> str | None:
        try:
            with open(path) as f:
                return json.load(f)["address"]
        except (OSError, ValueError, KeyError):  # not there yet, or half written
            return None

    return poll_until(address, timeout, interval=0.1, fail=fail)


def eligible_workers(client: Client, resources: Mapping[str, float] | None, timeout: float) -> list[str]:
    """Addresses of the workers that declare ``resources``, in a stable order (one bounded RPC).

    Asks the scheduler directly: ``Client.scheduler_info()`` returns a cache
    that the client's periodic refresh overwrites with a worker-less summary,
    and keeps a stale one when the RPC fails.
    """
    identity = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)
    workers = identity["workers"]
    out = []
    for address, info in workers.items():
        declared = info.get("resources") or {}
        if all(declared.get(k, 0) >= v for k, v in (resources or {}).items()):
            out.append(address)
    return sorted(out)


def wait_for_workers(
    client: Client, n: int, resources: Mapping[str, float] | None, timeout: float
) -> list[str]:
    """Waits until ``n`` eligible workers exist and returns their addresses.

    Raises:
        NotEnoughWorkersError: If fewer than ``n`` are there after ``timeout``.
    """
    found: list[str] = []

    def enough() -> list[str] | None:
        found[:] = eligible_workers(client, resources, timeout)
        return list(found) if len(found) >= n else None

    return poll_until(enough, timeout, fail=lambda: not_enough_workers(n, len(found), resources, timeout))


def not_enough_workers(
    needed: int, found: int, resources: Mapping[str, float] | None, timeout: float, detail: str = ""
) -> NotEnoughWorkersError:
    """The error for too few free eligible workers after ``timeout``; ``detail`` says what was seen."""
    what = f" declaring resources {dict(resources)}" if resources else ""
    seen = f" ({detail})" if detail else ""
    return NotEnoughWorkersError(
        f"Needed {needed} workers{what} (one per collector) but found {found} free after {timeout:g}s"
        f"{seen}. "
        "Start more workers, lower num_collectors, or raise daskcollect.timeouts.workers.",
        needed=needed,
        found=found,
    )


def live_workers(client: Client, timeout: float) -> set[str]:
    """The addresses of the workers the scheduler knows now (one bounded RPC).

    Raises:
        ClusterConnectionError: If the scheduler does not answer within ``timeout``.
    """
    # A client that lost its scheduler drops its rpc (client.scheduler becomes None).
    address = getattr(client.scheduler, "address", None) or "(the client has dropped it)"
    try:
        # ncores: {address: threads}, far lighter than the scheduler's identity.
        info = client.sync(client.scheduler.ncores, callback_timeout=timeout)
    except Exception as exc:
        raise ClusterConnectionError(
            f"Lost the scheduler at {address}: it did not answer within {timeout:g}s "
            f"({type(exc).__name__}: {exc}). Restart the scheduler and the collection; the workers' "
            "collectors cannot be reached without it.",
            address=address,
        ) from exc
    return set(info)


def share_cores(setting: int | str | None, engine: Any, handle: ClusterHandle) -> int | None:
    """Leaves the cores of collectors on this host to them, as TorchRL's multiprocess collectors do.

    With ``daskcollect.driver.torch-threads: auto``, the driver's torch
    threads become the cores less the collectors on this host (at least 1)
    until shutdown: a learner's thread pool on cores busy with rollouts
    spins and slows down (DQN's gradient steps ran 2-3 times slower).

    Returns:
        The driver's torch threads before, to restore at shutdown; ``None``
        if nothing changed.
    """
    import torch  # the driver has it by now; this module is imported without it too

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
