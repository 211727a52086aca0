"""Failure accounting and the restart budget."""

from __future__ import annotations

import pytest

from daskcollect import CollectorLostError
from daskcollect.monitoring.stats import FailureCounters


def test_counts_and_budget():
    f = FailureCounters()
    f.lost(2, 500, "collector 1 on tcp://127.0.0.1:1: its worker left the cluster")
    f.restarts += 1
    f.check_budget(1)  # 1 restart of 1 allowed
    assert f.as_dict() == {
        "frames_lost": 1000,
        "rollouts_lost": 2,
        "restarts": 1,
        "env_restarts": 0,
        "retired": 0,
    }
    f.env_restarts += 1
    with pytest.raises(
        CollectorLostError, match="restarted 2 times, more than max_collector_restarts=1"
    ) as info:
        f.check_budget(1)
    assert "Last failure: collector 1 on tcp://127.0.0.1:1" in str(info.value)
    assert info.value.restarts == 1 and info.value.env_restarts == 1
