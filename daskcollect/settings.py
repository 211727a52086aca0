"""The ``daskcollect`` section of :mod:`dask.config`, read and validated once per collector.

Defaults live in ``daskcollect.yaml`` and the schema beside it in
``daskcollect-schema.yaml`` (as distributed ships ``distributed-schema.yaml``).
:meth:`Settings.load` checks the merged config against the schema and parses
durations once, so a bad value raises :class:`~daskcollect.errors.ConfigurationError`
naming its key when a collector is built, never at call time deep inside.
Users override values the usual ways: ``~/.config/dask/*.yaml``,
``DASK_DASKCOLLECT__...`` environment variables, or
``dask.config.set({"daskcollect.timeouts.rollout": "1h"})``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

from daskcollect.errors import ConfigurationError

_HERE = os.path.dirname(__file__)

with open(os.path.join(_HERE, "daskcollect.yaml")) as f:
    DEFAULTS = yaml.safe_load(f)

dask.config.update_defaults(DEFAULTS)


@functools.cache
def _schema() -> dict:
    with open(os.path.join(_HERE, "daskcollect-schema.yaml")) as f:
        return yaml.safe_load(f)


def _canonical(section: Any) -> Any:
    """Keys with ``-`` for ``_``, as dask.config treats them (``DASK_DASKCOLLECT__ASYNC_DEPTH``).

    ``local-cluster.cluster-config`` holds Dask's own keys and is kept as it is.
    """
    if not isinstance(section, dict):
        return section
    return {
        k.replace("_", "-"): v if k.replace("_", "-") == "cluster-config" else _canonical(v)
        for k, v in section.items()
    }


def _validate(section: dict) -> None:
    import jsonschema

    validator = jsonschema.Draft7Validator(_schema())
    error = next(iter(sorted(validator.iter_errors(section), key=lambda e: list(e.path))), None)
    if error is None:
        _check_event_loop(section)
        return
    key = ".".join(["daskcollect", *map(str, error.absolute_path)])
    shown = "" if isinstance(error.instance, dict) else f" = {error.instance!r}"
    raise ConfigurationError(
        f"dask config {key}{shown} is invalid: {error.message}. Fix it in your dask config (yaml, "
        "DASK_DASKCOLLECT__... variables or dask.config.set); the keys, defaults and their meaning "
        "are in daskcollect/daskcollect.yaml.",
        key=key,
    )


def _check_event_loop(section: dict) -> None:
    """A private cluster asked to run on uvloop needs it installed (Dask would fail in each process)."""
    key = "daskcollect.local-cluster.cluster-config.distributed.admin.event-loop"
    loop = (section["local-cluster"]["cluster-config"] or {}).get("distributed.admin.event-loop", "asyncio")
    if loop not in ("asyncio", "tornado", "uvloop"):
        raise ConfigurationError(
            f"dask config {key} = {loop!r} is invalid: Dask runs 'asyncio', 'tornado' or 'uvloop'.", key=key
        )
    if loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigurationError(
            f"dask config {key} = 'uvloop', but uvloop is not installed. Install it (pip install uvloop; "
            "it is a dependency of daskcollect except on Windows), or set that key to 'asyncio'.",
            key=key,
        )


def _seconds(section: dict, key: str, optional: bool = False) -> float | None:
    node: Any = section
    for part in key.split("."):
        node = node[part]
    if node is None and optional:
        return None
    try:
        return float(parse_timedelta(node, default="s"))
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigurationError(
            f"dask config daskcollect.{key} = {node!r} is not a duration ({exc}). Use seconds or a "
            'string such as "30s", "500ms" or "1h".',
            key=f"daskcollect.{key}",
        ) from None


@dataclass(frozen=True)
class Timeouts:
    """Bounds, in seconds, of every blocking wait (``daskcollect.timeouts.*``)."""

    connect: float
    workers: float
    actor_start: float
    rollout: float
    weights: float
    call: float
    shutdown: float
    retire: float


@dataclass(frozen=True)
class WorkerSettings:
    """What the worker plugin and each actor apply (``daskcollect.worker.*``)."""

    torch_threads: int | None = 1
    gc_freeze: bool = True
    trim_sys_path: bool = True
    tick_interval: float | None = None
    retire_signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")


@dataclass(frozen=True)
class Settings:
    """Every ``daskcollect.*`` setting, validated, durations in seconds."""

    timeouts: Timeouts
    restart_delay: float
    max_collector_restarts: int
    report_interval: float
    history: float
    episode_window: int
    async_depth: int
    driver_torch_threads: int | str | None
    shared_memory_dir: str | None
    same_host_streams: bool
    scale_to_demand: bool
    max_unreleased: int
    reattach_grace: float | None
    local_host: str
    local_dashboard_address: str | None
    local_memory_limit: str | float | None
    local_scheduler_process: bool
    local_worker_start: str
    local_cluster_config: dict
    worker: WorkerSettings

    @classmethod
    def load(cls) -> Settings:
        """Reads ``dask.config``'s ``daskcollect`` section now and validates it.

        Raises:
            ConfigurationError: Naming the first key with a bad value.
        """
        section = _canonical(dask.config.get("daskcollect"))
        _validate(section)
        timeouts = {
            name.replace("-", "_"): _seconds(section, f"timeouts.{name}") for name in section["timeouts"]
        }
        weights = section["weights"]
        local = section["local-cluster"]
        worker = section["worker"]
        if (_seconds(section, "reattach.grace-period", optional=True) or 0) < 0:
            raise ConfigurationError(
                "dask config daskcollect.reattach.grace-period is negative. Use a duration such as "
                '"10 minutes", or null to turn re-attaching off.',
                key="daskcollect.reattach.grace-period",
            )
        return cls(
            timeouts=Timeouts(**timeouts),
            restart_delay=_seconds(section, "restart-delay"),
            max_collector_restarts=section["max-collector-restarts"],
            report_interval=_seconds(section, "dashboard.report-interval"),
            history=_seconds(section, "dashboard.history"),
            episode_window=section["dashboard"]["episode-window"],
            async_depth=section["async-depth"],
            driver_torch_threads=section["driver"]["torch-threads"],
            shared_memory_dir=weights["shared-memory-dir"] if weights["shared-memory"] else None,
            same_host_streams=section["streams"]["same-host"],
            scale_to_demand=section["scaling"]["follow-demand"],
            max_unreleased=section["memmap"]["max-unreleased"],
            reattach_grace=_seconds(section, "reattach.grace-period", optional=True) or None,
            local_host=local["host"],
            local_dashboard_address=local["dashboard-address"],
            local_memory_limit=local["memory-limit"],
            local_scheduler_process=local["scheduler-process"],
            local_worker_start=local["worker-start"],
            local_cluster_config=dict(local["cluster-config"] or {}),
            worker=WorkerSettings(
                torch_threads=worker["torch-threads"],
                gc_freeze=worker["gc-freeze"],
                trim_sys_path=worker["trim-sys-path"],
                tick_interval=_seconds(section, "worker.tick-interval", optional=True),
                retire_signals=tuple(dict.fromkeys(worker["retire-on-signals"])),
            ),
        )
