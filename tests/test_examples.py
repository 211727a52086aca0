"""The examples run top to bottom (short budgets)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_quickstart():
    out = run_example("quickstart.py")
    assert "batch 9: shape (2, 250), collected with weights v9" in out


def test_layouts():
    out = run_example("layouts.py", "--cpus", "2", "--frames", "2000")
    assert "1 collector(s) x 2 env(s)" in out and "2 collector(s) x 1 env(s)" in out
