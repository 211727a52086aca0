"""The fence: every use of a private API of Dask, TorchRL or tensordict, in one place.

daskcollect needs a few things that ``distributed``, ``torchrl`` and
``tensordict`` do not offer publicly. Each accessor below checks that the
internal is still there. Where a public fallback exists it takes it (TorchRL's
and tensordict's, and ``sync``); where none does, it raises
:class:`~daskcollect.errors.DaskVersionError`, naming the internal and the
versions daskcollect was tested with, instead of an ``AttributeError`` deep
inside a rollout. ``tests/test_internals.py`` checks each one against the
installed releases, so that a release that changes one fails loudly there.
:func:`check_version` warns once when the installed ``distributed`` is outside
the tested range.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable
from typing import Any

import distributed
from packaging.version import Version

from daskcollect.errors import DaskVersionError

#: The ``distributed`` releases these internals were checked against: [low, high).
TESTED = ("2026.1.0", "2026.9.0")  # as pyproject.toml pins it
_warned = False


def check_version() -> None:
    """Warns once if the installed ``distributed`` is outside :data:`TESTED`."""
    global _warned
    installed = Version(distributed.__version__)
    if _warned or Version(TESTED[0]) <= installed < Version(TESTED[1]):
        return
    _warned = True
    warnings.warn(
        f"daskcollect was tested with distributed>={TESTED[0]},<{TESTED[1]} and finds "
        f"{distributed.__version__}. It relies on a few Dask internals (daskcollect._internals); if one "
        "changed you will get a DaskVersionError naming it. Install a tested version to be safe.",
        RuntimeWarning,
        stacklevel=3,
    )


def _missing(what: str, exc: BaseException) -> DaskVersionError:
    return DaskVersionError(
        f"daskcollect needs Dask's internal {what}, which distributed {distributed.__version__} does "
        f"not have ({type(exc).__name__}: {exc}). daskcollect was tested with "
        f"distributed>={TESTED[0]},<{TESTED[1]}: install such a version, e.g. "
        f"pip install 'distributed>={TESTED[0]},<{TESTED[1]}'.",
        internal=what,
        version=distributed.__version__,
    )


# --- scheduler side ---------------------------------------------------------
def retire_handler(scheduler: Any) -> Callable:
    """The scheduler's ``retire_workers`` RPC handler."""
    try:
        return scheduler.handlers["retire_workers"]
    except (AttributeError, KeyError) as exc:
        raise _missing("Scheduler.handlers['retire_workers']", exc) from None


def set_retire_handler(scheduler: Any, handler: Callable) -> None:
    """Replaces the scheduler's ``retire_workers`` RPC handler."""
    retire_handler(scheduler)  # checks that it exists
    scheduler.handlers["retire_workers"] = handler


#: How ``Worker.close_gracefully`` (a worker's ``--lifetime``) starts the ``stimulus_id``
#: of the retirement it asks the scheduler for.
SELF_RETIREMENT = "worker-close-gracefully"


def is_self_retirement(kwargs: dict[str, Any]) -> bool:
    """Whether a ``retire_workers`` call is a worker retiring itself.

    Should Dask rename the stimulus, this answers ``False`` and the retirement
    is Dask's own: nothing breaks, so nothing is checked.
    """
    return str(kwargs.get("stimulus_id") or "").startswith(SELF_RETIREMENT)


def actor_keys(scheduler: Any, address: str) -> list[str]:
    """The keys of the actors that the worker at ``address`` holds (``[]`` if it is gone)."""
    ws = scheduler.workers.get(address)
    if ws is None:
        return []
    try:
        return [str(ts.key) for ts in ws.actors]
    except AttributeError as exc:
        raise _missing("WorkerState.actors", exc) from None


# --- client side ------------------------------------------------------------
async def cancel(client: Any, futures: list, reason: str) -> None:
    """Cancels ``futures`` from the client's event loop (``Client.cancel`` would block it)."""
    try:
        method = client._cancel
    except AttributeError as exc:
        raise _missing("Client._cancel", exc) from None
    await method(futures, reason=reason)


def stop_loop(owner: Any) -> None:
    """Stops the event-loop thread of a synchronous ``Client`` or cluster whose close Dask skips.

    A ``Client`` that closed itself after losing its scheduler returns from
    ``close()`` at once, and a ``SpecCluster`` whose start failed raises from
    its constructor: both leave their ``IO loop`` thread running for the life of
    the process. Stopping an already-stopped loop does nothing.
    """
    try:
        runner = owner._loop_runner
    except AttributeError as exc:
        raise _missing(f"{type(owner).__name__}._loop_runner", exc) from None
    runner.stop()


# --- worker side ------------------------------------------------------------
def tick_callback(worker: Any) -> Any | None:
    """The worker's ``tick`` periodic callback, or ``None`` where it has none."""
    try:
        return worker.periodic_callbacks.get("tick")
    except AttributeError as exc:
        raise _missing("Worker.periodic_callbacks", exc) from None


#: What ``Worker.heartbeat`` logs, as an error with a traceback, when its call fails.
HEARTBEAT_FAILURE = "Failed to communicate with scheduler during heartbeat"


class QuietHeartbeatAtClose(logging.Filter):
    """Drops the worker's heartbeat failure once the worker itself is closing.

    ``Worker.close`` closes its connection pool while a heartbeat may still be
    waiting on the scheduler's answer (a loaded machine, a cluster closing all
    its workers at once); Dask then logs that heartbeat as an error with a
    traceback although nothing failed. A heartbeat that fails while the worker
    runs is still logged. Should Dask reword the message, the filter lets it
    through: nothing breaks, so nothing is checked.

    Args:
        worker: The worker whose records to filter.
    """

    def __init__(self, worker: Any):
        super().__init__()
        self.worker = worker

    def closing(self) -> bool:
        """Whether the worker is closing or closed."""
        return getattr(self.worker.status, "name", "") in ("closing", "closing_gracefully", "closed")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.closing() and record.getMessage().startswith(HEARTBEAT_FAILURE))


async def run_actor_method(worker: Any, key: str, method: str, *args: Any) -> dict[str, Any]:
    """Runs ``method`` of the actor ``key`` held by ``worker``, as Dask's ``actor_execute`` request does.

    A sync method runs in the worker's actor thread, with the worker context
    that ``distributed.get_worker()`` reads; the answer is Dask's:
    ``{"status": "OK", "result": ...}`` or ``{"status": "error", "exception": ...}``.

    Raises:
        KeyError: If the worker no longer holds the actor.
    """
    try:
        execute = worker.actor_execute
    except AttributeError as exc:
        raise _missing("Worker.actor_execute", exc) from None
    return await execute(actor=key, function=method, args=args)


def add_handlers(worker: Any, handlers: dict[str, Callable]) -> None:
    """Adds request handlers to the worker's server (what ``rpc(worker).<name>(...)`` calls)."""
    try:
        worker.handlers.update(handlers)
    except AttributeError as exc:
        raise _missing("Worker.handlers", exc) from None


def remove_handlers(worker: Any, prefix: str) -> list[str]:
    """Removes the worker's request handlers whose names start with ``prefix``; their names."""
    try:
        names = [name for name in worker.handlers if name.startswith(prefix)]
    except AttributeError as exc:
        raise _missing("Worker.handlers", exc) from None
    for name in names:
        del worker.handlers[name]
    return names


async def fetch_from_peers(worker: Any, key: str, order: Callable[[list[str]], list[str]]) -> Any:
    """Fetches the data of ``key`` from a worker that holds it (from an actor's worker).

    A ``Future`` made in an actor thread never resolves, so the actor asks the
    scheduler who holds the key and gets it from those workers directly, in the
    order ``order`` puts them.

    Raises:
        KeyError: If no live worker holds it.
    """
    try:
        from distributed.worker import get_data_from_worker

        who_has = worker.scheduler.who_has
    except (ImportError, AttributeError) as exc:
        raise _missing("distributed.worker.get_data_from_worker / Scheduler.who_has", exc) from None
    holders = order((await who_has(keys=[key])).get(key, []))
    for address in holders:
        response = await get_data_from_worker(worker.rpc, [key], address, who=worker.address)
        if response.get("status") == "OK" and key in response["data"]:
            return response["data"][key]
    raise KeyError(f"{key} is held by no live worker ({holders})")


def drop_periodic_callbacks(server: Any, names: tuple[str, ...]) -> list[str]:
    """Stops and removes ``server``'s periodic callbacks of those ``names``; the names it had."""
    try:
        callbacks = server.periodic_callbacks
    except AttributeError as exc:
        raise _missing(f"{type(server).__name__}.periodic_callbacks", exc) from None
    dropped = [name for name in names if name in callbacks]
    for name in dropped:
        callbacks.pop(name).stop()
    return dropped


def worker_addresses_by_name(scheduler: Any) -> dict[str, str]:
    """Each worker's address and its name, as the scheduler knows them."""
    try:
        return {address: str(ws.name) for address, ws in scheduler.workers.items()}
    except AttributeError as exc:
        raise _missing("Scheduler.workers / WorkerState.name", exc) from None


def subscribed_topics(scheduler: Any) -> list[str]:
    """The event topics that some client subscribes to on ``scheduler``."""
    try:
        topics = scheduler._broker._topics
    except AttributeError as exc:
        raise _missing("Scheduler._broker._topics", exc) from None
    return sorted(str(name) for name, topic in topics.items() if topic.subscribers)


def published_datasets(scheduler: Any) -> list[str]:
    """The names of the datasets published on ``scheduler`` (``Client.list_datasets``, from inside)."""
    try:
        return sorted(map(str, scheduler.extensions["publish"].datasets))
    except (AttributeError, KeyError) as exc:
        raise _missing("Scheduler.extensions['publish'].datasets", exc) from None


def drop_dataset(scheduler: Any, name: str) -> bool:
    """Unpublishes dataset ``name`` from inside the scheduler, as ``Client.unpublish_dataset`` does;
    ``False`` if there is none."""
    try:
        extension = scheduler.extensions["publish"]
        dataset = extension.datasets.pop(name, None)
        if dataset is not None:
            scheduler.client_releases_keys(dataset["keys"], f"published-{name}")
    except (AttributeError, KeyError, TypeError) as exc:
        raise _missing("PublishExtension.datasets / Scheduler.client_releases_keys", exc) from None
    return dataset is not None


def workers_to_close(scheduler: Any, n: int | None, memory_ratio: float | None) -> list[str]:
    """The workers Dask's ``retire_workers(n=..., memory_ratio=...)`` would choose."""
    try:
        choose = scheduler.workers_to_close
    except AttributeError as exc:
        raise _missing("Scheduler.workers_to_close", exc) from None
    return list(choose(n=n, memory_ratio=memory_ratio))


def local_data(worker: Any, key: str) -> Any | None:
    """The value of ``key`` in the worker's memory, or ``None``."""
    try:
        data = worker.data
    except AttributeError as exc:
        raise _missing("Worker.data", exc) from None
    return data[key] if key in data else None


def rpc(owner: Any, address: str) -> Any:
    """A pooled RPC to ``address`` from a ``Worker`` or a ``Client`` (``rpc(...).<handler>(...)``)."""
    try:
        pool = owner.rpc
    except AttributeError as exc:
        raise _missing(f"{type(owner).__name__}.rpc", exc) from None
    return pool(address)


async def read_variable(worker: Any, name: str, timeout: float) -> Any | None:
    """The value of the Dask ``Variable`` ``name`` (one set from a ``Client``), read from inside a worker
    through the scheduler's variable handler, as ``Variable.get`` does; ``None`` if it is not set within
    ``timeout`` seconds. Only msgpack-able values."""
    try:
        scheduler = worker.scheduler
    except AttributeError as exc:
        raise _missing("Worker.scheduler", exc) from None
    try:
        record = await scheduler.variable_get(name=name, client=worker.id, timeout=timeout)
    except (TimeoutError, asyncio.TimeoutError):
        return None
    if record.get("type") != "msgpack":
        raise _missing("VariableExtension.get's msgpack record", KeyError(record.get("type")))
    return record["value"]


try:
    from distributed.utils import sync as _dasks_sync
except ImportError:  # looked up once, not on every call
    _dasks_sync = None


def sync(loop: Any, func: Callable, *args: Any, callback_timeout: float | None = None, **kwargs: Any) -> Any:
    """Runs the coroutine function ``func`` on the event loop ``loop`` (a Tornado ``IOLoop`` in another
    thread) and returns its result, as Dask's own ``sync`` does; asyncio's public equivalent where
    Dask's is gone."""
    if _dasks_sync is not None:
        return _dasks_sync(loop, func, *args, callback_timeout=callback_timeout, **kwargs)
    future = asyncio.run_coroutine_threadsafe(func(*args, **kwargs), loop.asyncio_loop)
    try:
        return future.result(callback_timeout)
    except TimeoutError:
        future.cancel()
        raise


# --- TorchRL and tensordict ---------------------------------------------------
def set_weight_sync_schemes(collector: Any, schemes: dict[str, Any] | None) -> None:
    """Gives a ``BaseCollector`` subclass its ``{model_id: scheme}``.

    ``BaseCollector.update_policy_weights_`` dispatches on this attribute, and
    TorchRL's trainers read it to find the collector's schemes; TorchRL has no
    public setter.
    """
    from torchrl.collectors import BaseCollector

    if not hasattr(BaseCollector, "_weight_sync_schemes"):
        raise _missing("BaseCollector._weight_sync_schemes", AttributeError("_weight_sync_schemes"))
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
        raise _missing("Collector._carrier", AttributeError("_carrier"))
    collector._carrier = carrier


def inference_stamp_key() -> str:
    """The key under which TorchRL's ``PolicyClientModule`` sends the caller's interaction type to an
    inference server (its requests always carry it)."""
    try:
        from torchrl.modules.inference_server._client import _REMOTE_INTERACTION_TYPE_KEY
    except ImportError as exc:
        raise _missing("torchrl.modules.inference_server._client._REMOTE_INTERACTION_TYPE_KEY", exc) from None
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
