"""Turns ``client`` / ``scheduler_file`` / nothing into a Client we own (runs on the driver).

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import dask.config
from distributed import Client, SpecCluster
from distributed.comm import connect as comm_connect
from distributed.security import Security

from daskcollect import _internals
from daskcollect.collection.options import ClusterOptions
from daskcollect.collection.polling import poll_until
from daskcollect.deploy.main_guard import check_main_guard
from daskcollect.deploy.private import local_cluster
from daskcollect.deploy.py_modules import ship
from daskcollect.errors import ClusterConnectionError
from daskcollect.settings import Settings
from daskcollect.worker.signals import NANNY_PLUGIN_PREFIX

logger = logging.getLogger(__name__)

#: The prefix of the topics of :func:`echo`.
ECHO_TOPIC = "daskcollect-echo"


def echo(client: Client, timeout: float) -> bool:
    """Waits (bounded) until an event that this client logs comes back to it; ``False`` if none did.

    A subscription, a cancel and the scheduler's reports to the client travel
    on the client's ordered stream; the first event of a fresh topic that
    comes back was therefore sent after everything the scheduler had queued
    for this client, and after it took this client's earlier subscriptions.
    The event itself goes by RPC, which may overtake the subscription: it is
    logged again until one comes back.
    """
    token = uuid.uuid4().hex
    topic = f"{ECHO_TOPIC}-{token}"
    came = threading.Event()

    def on_event(event: tuple) -> None:
        if event[1] == token:
            came.set()

    try:
        client.subscribe_topic(topic, on_event)

        def echoed() -> bool:
            client.log_event(topic, token)
            return came.wait(0.05)

        return bool(poll_until(echoed, timeout, interval=0.0))
    except Exception as exc:  # a client that lost its scheduler: nothing comes back
        logger.debug("no echo (%s: %s)", type(exc).__name__, exc)
        return False
    finally:
        with contextlib.suppress(Exception):
            client.unsubscribe_topic(topic)


@dataclass
class ClusterHandle:
    """Our Client, and the private cluster when we started one.

    Attributes:
        client: Our own ``Client(direct_to_workers=True)``, closed with the
            collection; a user's ``Client`` is never closed nor changed.
        cluster: The private cluster (a ``LocalCluster``, or its layout as a ``SpecCluster``), or ``None`` for a user's cluster.
        given: The user's ``Client``, where one was given.
        plugins: The worker and nanny plugins registered through
            :meth:`register_plugin`, removed from a user's cluster at :meth:`close`
            (nanny plugins by their name's :data:`NANNY_PLUGIN_PREFIX`).
    """

    client: Client
    cluster: SpecCluster | None = None
    given: Client | None = None
    plugins: list[str] = field(default_factory=list)

    def _drain(self, timeout: float) -> None:
        """Waits (bounded) until the scheduler has sent us everything it queued for us.

        Cancelling our actors makes the scheduler queue a report to every
        client; closing ours before that report is written leaves a
        ``CommClosedError`` traceback in the scheduler's log (:func:`echo`).
        """
        echo(self.client, timeout)

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:  # no dashboard (bokeh missing or disabled)
            return None

    def register_plugin(self, plugin: Any, name: str) -> None:
        """Registers a worker or nanny plugin, to be removed when this handle closes.

        A nanny plugin's name starts with :data:`NANNY_PLUGIN_PREFIX`: the
        name alone then says how to remove it, also for a driver that re-attaches.
        """
        self.client.register_plugin(plugin, name=name)
        self.plugins.append(name)

    def adopt_plugins(self, names: list[str]) -> None:
        """Worker plugins another driver registered, removed at :meth:`close` after ours."""
        self.plugins[:0] = [n for n in names if n not in self.plugins]

    def _unregister_plugins(self) -> None:
        for name in reversed(self.plugins):
            try:
                self.client.unregister_worker_plugin(name, nanny=name.startswith(NANNY_PLUGIN_PREFIX))
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
            cluster = local_cluster(options, n_workers, settings)
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
def _connect_existing(options: ClusterOptions, timeout: float) -> ClusterHandle:
    target = options.client
    kwargs: dict[str, Any] = dict(direct_to_workers=True, set_as_default=False, timeout=timeout)
    if isinstance(target, Client):
        address = _internals.scheduler_address(target)
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
