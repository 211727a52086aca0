"""Settings: read and validated once against daskcollect-schema.yaml; bad values name their key."""

from __future__ import annotations

import dask
import pytest
from makers import make_cartpole

from daskcollect import ConfigurationError, DaskCollector
from daskcollect.settings import Settings


def test_defaults_are_valid_and_durations_are_seconds():
    settings = Settings.load()
    assert settings.timeouts.rollout > 0 and settings.restart_delay == 1.0
    assert settings.async_depth >= 1 and settings.worker.tick_interval == 1.0
    with dask.config.set({"daskcollect.timeouts.rollout": "1h", "daskcollect.worker.tick-interval": None}):
        settings = Settings.load()
    assert settings.timeouts.rollout == 3600.0 and settings.worker.tick_interval is None
    assert settings.reattach_grace is None  # off by default (docs/long_runs.md)
    with dask.config.set({"daskcollect.reattach.grace-period": "10 minutes"}):
        assert Settings.load().reattach_grace == 600.0


@pytest.mark.parametrize(
    "key, value",
    [
        ("daskcollect.driver.torch-threads", "many"),
        ("daskcollect.timeouts.rollout", None),
        ("daskcollect.timeouts.call", "soon"),
        ("daskcollect.async-depth", 0),
        ("daskcollect.memmap.max-unreleased", "16"),
        ("daskcollect.weights.shared-memory", "yes"),
        ("daskcollect.timeouts.rollot", "10s"),
        ("daskcollect.reattach.grace-period", "-5s"),
        ("daskcollect.reattach.grace-period", "later"),
    ],
)
def test_a_bad_value_names_its_key(key, value):
    with dask.config.set({key: value}), pytest.raises(ConfigurationError) as info:
        Settings.load()
    named = key if not key.endswith("rollot") else "daskcollect.timeouts"
    assert named in str(info.value) and info.value.key.startswith(named)


@pytest.mark.parametrize(("loop", "message"), [("fast", "'asyncio', 'tornado' or 'uvloop'"), (None, None)])
def test_the_private_clusters_event_loop_is_checked(loop, message):
    """uvloop by default (docs/benchmarks.md, P7); a loop Dask does not run is named before any cluster."""
    config = Settings.load().local_cluster_config
    assert config["distributed.admin.event-loop"] == "uvloop"
    if loop is None:
        return
    with dask.config.set(
        {"daskcollect.local-cluster.cluster-config": {**config, "distributed.admin.event-loop": loop}}
    ):
        with pytest.raises(ConfigurationError, match=message) as info:
            Settings.load()
    assert info.value.key.endswith("distributed.admin.event-loop")


def test_environment_variables_with_underscores_are_read():
    """DASK_DASKCOLLECT__ASYNC_DEPTH=1 spells the key with "_", as dask.config allows."""
    with dask.config.set({"daskcollect.async_depth": 3, "daskcollect.timeouts.actor_start": "5s"}):
        settings = Settings.load()
    assert settings.async_depth == 3 and settings.timeouts.actor_start == 5.0


def test_a_collector_rejects_bad_settings_before_touching_a_cluster():
    with dask.config.set({"daskcollect.driver.torch-threads": "many"}):
        with pytest.raises(ConfigurationError, match="daskcollect.driver.torch-threads"):
            DaskCollector(make_cartpole, frames_per_batch=10, client="tcp://127.0.0.1:1")
