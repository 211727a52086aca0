"""The fence: every use of a private API of Dask, TorchRL or tensordict, in one package.

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

Its modules say whose internals they hold: :mod:`.scheduler`, :mod:`.client`,
:mod:`.worker` (Dask's), :mod:`.torchrl` (TorchRL's and tensordict's), and
:mod:`.versions` (the releases checked). The rest of daskcollect uses them as
``_internals.<name>``, from here; ``tests/test_internals.py`` scans the package
for any other use.
"""

from __future__ import annotations

from daskcollect._internals.client import (
    DONT_REPLY,
    actor_answer,
    cancel,
    is_serialized,
    log_event,
    rpc,
    rpc_message,
    run_loop,
    scheduler_address,
    serialized,
    stop_loop,
    sync,
    unwrap_actor_result,
    worker_identities,
)
from daskcollect._internals.scheduler import (
    SELF_RETIREMENT,
    WORKER_EVENTS_TOPIC,
    actor_keys,
    add_http_routes,
    add_scheduler_plugin,
    connected_clients,
    drop_dataset,
    forget_subscriber,
    handler_names,
    is_self_retirement,
    published_datasets,
    registered_worker_plugins,
    remove_scheduler_plugin,
    route_counts,
    scheduler_handler,
    scheduler_plugin,
    scheduler_plugin_names,
    set_scheduler_handler,
    subscribed_topics,
    task_keys,
    unregister_worker_plugin,
    worker_addresses_by_name,
    worker_change,
    worker_state_address,
    workers_to_close,
)
from daskcollect._internals.torchrl import (
    collector_backends,
    collector_carrier,
    default_exploration_type,
    inference_stamp_key,
    refuse_service_backend,
    register_collector_backend,
    set_collector_carrier,
    set_weight_sync_schemes,
    tensordict_unchecked,
    wrap_collector_policy,
)
from daskcollect._internals.versions import (
    TESTED,
    check_version,
)
from daskcollect._internals.worker import (
    HEARTBEAT_FAILURE,
    QuietHeartbeatAtClose,
    add_handlers,
    data_keys,
    drop_periodic_callbacks,
    fetch_from_peers,
    held_actors,
    local_data,
    read_variable,
    remove_handlers,
    run_actor_method,
    runs_dask_worker_cli,
    tick_callback,
    worker_nthreads,
    worker_plugins,
)

__all__ = [
    "DONT_REPLY",
    "HEARTBEAT_FAILURE",
    "QuietHeartbeatAtClose",
    "SELF_RETIREMENT",
    "TESTED",
    "WORKER_EVENTS_TOPIC",
    "actor_answer",
    "actor_keys",
    "add_handlers",
    "add_http_routes",
    "add_scheduler_plugin",
    "cancel",
    "check_version",
    "collector_backends",
    "collector_carrier",
    "connected_clients",
    "data_keys",
    "default_exploration_type",
    "drop_dataset",
    "drop_periodic_callbacks",
    "fetch_from_peers",
    "forget_subscriber",
    "handler_names",
    "held_actors",
    "inference_stamp_key",
    "is_self_retirement",
    "is_serialized",
    "local_data",
    "log_event",
    "published_datasets",
    "read_variable",
    "refuse_service_backend",
    "register_collector_backend",
    "registered_worker_plugins",
    "remove_handlers",
    "remove_scheduler_plugin",
    "route_counts",
    "rpc",
    "rpc_message",
    "run_actor_method",
    "run_loop",
    "runs_dask_worker_cli",
    "scheduler_address",
    "scheduler_handler",
    "scheduler_plugin",
    "scheduler_plugin_names",
    "serialized",
    "set_collector_carrier",
    "set_scheduler_handler",
    "set_weight_sync_schemes",
    "stop_loop",
    "subscribed_topics",
    "sync",
    "task_keys",
    "tensordict_unchecked",
    "tick_callback",
    "unregister_worker_plugin",
    "unwrap_actor_result",
    "worker_addresses_by_name",
    "worker_change",
    "worker_identities",
    "worker_nthreads",
    "worker_plugins",
    "worker_state_address",
    "workers_to_close",
    "wrap_collector_policy",
]
