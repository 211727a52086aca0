"""The fence, scheduler side: Dask's ``Scheduler`` internals that daskcollect's scheduler plugins use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daskcollect._internals.versions import attribute, missing, names


# --- scheduler side ---------------------------------------------------------
def scheduler_handler(scheduler: Any, name: str) -> Callable:
    """The scheduler's RPC handler ``name`` (``"retire_workers"``, ``"adaptive_target"``)."""
    try:
        return scheduler.handlers[name]
    except (AttributeError, KeyError) as exc:
        raise missing(f"Scheduler.handlers[{name!r}]", exc) from None


def set_scheduler_handler(scheduler: Any, name: str, handler: Callable) -> None:
    """Replaces the scheduler's RPC handler ``name``."""
    scheduler_handler(scheduler, name)  # checks that it exists
    scheduler.handlers[name] = handler


def worker_state_address(ws: Any) -> str:
    """The address of a scheduler's ``WorkerState`` (what ``valid_workers_downscaling`` gets)."""
    try:
        return str(ws.address)
    except AttributeError as exc:
        raise missing("WorkerState.address", exc) from None


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
        raise missing("WorkerState.actors", exc) from None


def scheduler_plugin(scheduler: Any, name: str) -> Any | None:
    """The scheduler plugin registered as ``name``, or ``None``."""
    try:
        return scheduler.plugins.get(name)
    except AttributeError as exc:
        raise missing("Scheduler.plugins", exc) from None


def scheduler_plugin_names(scheduler: Any) -> list[str]:
    """The names of the scheduler's plugins."""
    return names(scheduler, "plugins", "Scheduler.plugins")


async def add_scheduler_plugin(scheduler: Any, plugin: Any, name: str) -> None:
    """Registers ``plugin`` as ``name`` from inside the scheduler, as ``Client.register_plugin`` does."""
    register = attribute(scheduler, "register_scheduler_plugin", "Scheduler.register_scheduler_plugin")
    await register(plugin, name=name, idempotent=False)


def remove_scheduler_plugin(scheduler: Any, name: str) -> None:
    """Removes the scheduler plugin ``name`` from inside the scheduler (its ``close`` is the caller's)."""
    remove = attribute(scheduler, "remove_plugin", "Scheduler.remove_plugin")
    remove(name=name)


def registered_worker_plugins(scheduler: Any) -> list[str]:
    """The names of the worker plugins the scheduler holds (and gives workers that join)."""
    return names(scheduler, "worker_plugins", "Scheduler.worker_plugins")


async def unregister_worker_plugin(scheduler: Any, name: str) -> None:
    """Removes the worker plugin ``name`` from inside the scheduler, as ``Client.unregister_worker_plugin``
    does through the scheduler's handler: every worker runs its teardown."""
    try:
        handler = scheduler.handlers["unregister_worker_plugin"]
    except (AttributeError, KeyError) as exc:
        raise missing("Scheduler.handlers['unregister_worker_plugin']", exc) from None
    await handler(comm=None, name=name)


def connected_clients(scheduler: Any) -> set[str]:
    """The ids of the clients connected to the scheduler now."""
    try:
        return set(map(str, scheduler.clients))
    except AttributeError as exc:
        raise missing("Scheduler.clients", exc) from None


def handler_names(server: Any) -> list[str]:
    """The RPC handlers a scheduler or worker answers."""
    return names(server, "handlers", f"{type(server).__name__}.handlers")


def task_keys(scheduler: Any) -> list[str]:
    """The keys of every task the scheduler knows."""
    return names(scheduler, "tasks", "Scheduler.tasks")


def add_http_routes(scheduler: Any, routes: list[tuple]) -> Callable[[], None] | None:
    """Serves Tornado ``routes`` on the scheduler's dashboard server; the function that removes them, or
    ``None`` where the scheduler serves no dashboard."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return None
    try:
        routers = [app.default_router, app.wildcard_router]
        before = [list(router.rules) for router in routers]
        app.add_handlers(r".*$", routes)
        added = [
            (router.rules, r)
            for router, rules in zip(routers, before)
            for r in router.rules
            if r not in rules
        ]
    except AttributeError as exc:
        raise missing("Scheduler.http_application's routers", exc) from None

    def remove() -> None:
        for rules, rule in added:
            if rule in rules:
                rules.remove(rule)

    return remove


def route_counts(scheduler: Any) -> list[int]:
    """How many routes the scheduler's dashboard server has (its default and wildcard routers)."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return []
    try:
        return [len(app.default_router.rules), len(app.wildcard_router.rules)]
    except AttributeError as exc:
        raise missing("Scheduler.http_application's routers", exc) from None


#: The topic on which Dask's scheduler logs each worker it adds or removes (with other cluster events).
WORKER_EVENTS_TOPIC = "all"


def worker_change(msg: Any) -> tuple[str, str] | None:
    """``("added" | "removed", address)`` for one of the scheduler's :data:`WORKER_EVENTS_TOPIC` events
    about a worker, ``None`` for the others. Should Dask rename them, no change is seen: the rollout
    timeouts and the streams' closing still find lost collectors, so nothing is checked here."""
    if not isinstance(msg, dict):
        return None
    action, address = msg.get("action"), msg.get("worker")
    if not isinstance(address, str):
        return None
    return {"add-worker": ("added", address), "remove-worker": ("removed", address)}.get(action)


def worker_addresses_by_name(scheduler: Any) -> dict[str, str]:
    """Each worker's address and its name, as the scheduler knows them."""
    try:
        return {address: str(ws.name) for address, ws in scheduler.workers.items()}
    except AttributeError as exc:
        raise missing("Scheduler.workers / WorkerState.name", exc) from None


def subscribed_topics(scheduler: Any) -> list[str]:
    """The event topics that some client subscribes to on ``scheduler``."""
    topics = attribute(scheduler, "_broker._topics", "Scheduler._broker._topics")
    return sorted(str(name) for name, topic in topics.items() if topic.subscribers)


def forget_subscriber(scheduler: Any, client: str) -> list[str]:
    """Unsubscribes the departed ``client`` from every event topic; returns the topics it left.

    Dask keeps a disconnected client's subscriptions for good (only its events are truncated, after
    ``distributed.scheduler.events-cleanup-delay``), so a killed driver would leave them behind.
    """
    topics = attribute(scheduler, "_broker._topics", "Scheduler._broker._topics")
    left = sorted(str(name) for name, topic in topics.items() if client in topic.subscribers)
    for name in left:
        scheduler.unsubscribe_topic(name, client)
    return left


def published_datasets(scheduler: Any) -> list[str]:
    """The names of the datasets published on ``scheduler`` (``Client.list_datasets``, from inside)."""
    try:
        return sorted(map(str, scheduler.extensions["publish"].datasets))
    except (AttributeError, KeyError) as exc:
        raise missing("Scheduler.extensions['publish'].datasets", exc) from None


def drop_dataset(scheduler: Any, name: str) -> bool:
    """Unpublishes dataset ``name`` from inside the scheduler, as ``Client.unpublish_dataset`` does;
    ``False`` if there is none."""
    try:
        extension = scheduler.extensions["publish"]
        dataset = extension.datasets.pop(name, None)
        if dataset is not None:
            scheduler.client_releases_keys(dataset["keys"], f"published-{name}")
    except (AttributeError, KeyError, TypeError) as exc:
        raise missing("PublishExtension.datasets / Scheduler.client_releases_keys", exc) from None
    return dataset is not None


def workers_to_close(scheduler: Any, n: int | None, memory_ratio: float | None) -> list[str]:
    """The workers Dask's ``retire_workers(n=..., memory_ratio=...)`` would choose."""
    choose = attribute(scheduler, "workers_to_close", "Scheduler.workers_to_close")
    return list(choose(n=n, memory_ratio=memory_ratio))
