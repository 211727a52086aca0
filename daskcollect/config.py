"""Defaults under the ``daskcollect`` key of :mod:`dask.config`.

The shipped YAML is merged into Dask's defaults at import, so users override
values the usual ways: ``~/.config/dask/*.yaml``, ``DASK_DASKCOLLECT__...``
environment variables, or ``dask.config.set({"daskcollect.timeouts.rollout": "1h"})``.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

_YAML = os.path.join(os.path.dirname(__file__), "daskcollect.yaml")

with open(_YAML) as f:
    _DEFAULTS = yaml.safe_load(f)

dask.config.update_defaults(_DEFAULTS)


def get(key: str, default: Any = None) -> Any:
    """Reads ``daskcollect.<key>`` from :mod:`dask.config`."""
    return dask.config.get(f"daskcollect.{key}", default=default)


def seconds(key: str) -> float | None:
    """Reads a duration (``"1s"``, ``"20ms"``, a number of seconds) as seconds; ``None`` stays."""
    value = get(key)
    return None if value is None else parse_timedelta(value, default="s")


def timeout(name: str) -> float:
    """Returns the timeout ``daskcollect.timeouts.<name>`` in seconds."""
    return seconds(f"timeouts.{name}")
