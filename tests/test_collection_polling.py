"""poll_until: bounded, returns the first truthy value, raises the given error on time-out."""

from __future__ import annotations

import time

import pytest

from daskcollect.collection.polling import poll_until


def test_returns_the_first_truthy_value():
    values = iter([0, None, "", 7, 8])
    assert poll_until(lambda: next(values), 5, interval=0.001) == 7


def test_raises_the_given_error_within_the_bound():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="gone"):
        poll_until(lambda: False, 0.2, interval=0.05, fail=lambda: TimeoutError("gone"))
    assert 0.2 <= time.monotonic() - start < 1.0


def test_without_fail_returns_the_last_value():
    assert poll_until(lambda: [], 0.05, interval=0.01) == []
