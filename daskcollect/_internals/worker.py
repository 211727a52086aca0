"""The fence, worker side: Dask's ``Worker`` internals that the collectors' workers use."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from daskcollect._internals.versions import attribute, missing, names

# --- worker side ------------------------------------------------------------
#: The module that ``dask worker`` runs (as ``__main__`` under ``python -m``, imported by the ``dask`` CLI).
DASK_WORKER_CLI = "distributed.cli.dask_worker"


def runs_dask_worker_cli() -> bool:
    """Whether this process was started by ``dask worker``, or spawned by one (its worker processes)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return DASK_WORKER_CLI in sys.modules or getattr(spec, "name", None) == DASK_WORKER_CLI


def tick_callback(worker: Any) -> Any | None:
    """The worker's ``tick`` periodic callback, or ``None`` where it has none."""
    try:
        return worker.periodic_callbacks.get("tick")
    except AttributeError as exc:
        raise missing("Worker.periodic_callbacks", exc) from None


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
    execute = attribute(worker, "actor_execute", "Worker.actor_execute")
    return await execute(actor=key, function=method, args=args)


def add_handlers(worker: Any, handlers: dict[str, Callable]) -> None:
    """Adds request handlers to the worker's server (what ``rpc(worker).<name>(...)`` calls)."""
    try:
        worker.handlers.update(handlers)
    except AttributeError as exc:
        raise missing("Worker.handlers", exc) from None


def remove_handlers(worker: Any, prefix: str) -> list[str]:
    """Removes the worker's request handlers whose names start with ``prefix``; their names."""
    try:
        names = [name for name in worker.handlers if name.startswith(prefix)]
    except AttributeError as exc:
        raise missing("Worker.handlers", exc) from None
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
        raise missing("distributed.worker.get_data_from_worker / Scheduler.who_has", exc) from None
    holders = order((await who_has(keys=[key])).get(key, []))
    for address in holders:
        response = await get_data_from_worker(worker.rpc, [key], address, who=worker.address)
        if response.get("status") == "OK" and key in response["data"]:
            return response["data"][key]
    raise KeyError(f"{key} is held by no live worker ({holders})")


def drop_periodic_callbacks(server: Any, names: tuple[str, ...]) -> list[str]:
    """Stops and removes ``server``'s periodic callbacks of those ``names``; the names it had."""
    callbacks = attribute(server, "periodic_callbacks", f"{type(server).__name__}.periodic_callbacks")
    dropped = [name for name in names if name in callbacks]
    for name in dropped:
        callbacks.pop(name).stop()
    return dropped


def local_data(worker: Any, key: str) -> Any | None:
    """The value of ``key`` in the worker's memory, or ``None``."""
    data = attribute(worker, "data", "Worker.data")
    return data[key] if key in data else None


async def read_variable(worker: Any, name: str, timeout: float) -> Any | None:
    """The value of the Dask ``Variable`` ``name`` (one set from a ``Client``), read from inside a worker
    through the scheduler's variable handler, as ``Variable.get`` does; ``None`` if it is not set within
    ``timeout`` seconds. Only msgpack-able values."""
    scheduler = attribute(worker, "scheduler", "Worker.scheduler")
    try:
        record = await scheduler.variable_get(name=name, client=worker.id, timeout=timeout)
    except (TimeoutError, asyncio.TimeoutError):
        return None
    if record.get("type") != "msgpack":
        raise missing("VariableExtension.get's msgpack record", KeyError(record.get("type")))
    return record["value"]


def worker_nthreads(worker: Any) -> int:
    """The threads the worker declares (``dask worker --nthreads``)."""
    try:
        return int(worker.state.nthreads)
    except AttributeError as exc:
        raise missing("Worker.state.nthreads", exc) from None


def worker_plugins(worker: Any) -> dict[str, Any]:
    """The worker's plugins by name."""
    try:
        return dict(worker.plugins)
    except AttributeError as exc:
        raise missing("Worker.plugins", exc) from None


def data_keys(worker: Any) -> list[str]:
    """The keys of the data the worker holds in memory."""
    return names(worker, "data", "Worker.data")


def held_actors(worker: Any) -> list[str]:
    """The keys of the actors the worker hosts."""
    return names(worker, "state.actors", "Worker.state.actors")
