"""The docs are tests: every Python block of README.md and docs/*.md runs as a script.

Sybil finds the blocks; each runs as a user would run it after pasting it into
a file: ``python snippet.py`` in a fresh folder, in a new process (so that a
missing ``if __name__ == "__main__":`` fails here as it would there). A block
passes when it exits 0 and prints no Python warning and no traceback (Dask's
own log records of shutdown races excepted). A block that
cannot run here (a real SLURM cluster, certificates of one's own) carries
``<!-- skip: next "why" -->`` just above it in the Markdown source.

The convention that keeps the suite short: the blocks collect a few thousand
frames (``total_frames`` ≤ 10,000), and say so where they set it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from tests.helpers import noise

#: Under pytest-timeout's 120 s: a private cluster starts in seconds, the frames take seconds more.
BLOCK_TIMEOUT_S = 100


def run_as_script(example: Example) -> None:
    """Runs one block in a new interpreter; fails with its output on an error, traceback or warning."""
    with tempfile.TemporaryDirectory(prefix="daskcollect-doc-") as folder:
        script = Path(folder) / "snippet.py"
        script.write_text(example.parsed)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "DASK_"))}
        out = subprocess.run(
            [sys.executable, str(script)],
            cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
        )  # fmt: skip
    where = f"{Path(example.path).name}, line {example.line}"
    assert out.returncode == 0, f"{where} exited {out.returncode}:\n{out.stderr[-4000:]}"
    assert not noise(out.stderr), f"{where} printed:\n{out.stderr[-4000:]}"


#: The files that take longest (CPU seconds, measured 2026-12-07): handed to the pytest-xdist workers first, so
#: that no long file starts last and runs alone at the end.
LONGEST_FIRST = (
    "tests/test_slurm.py",  # the longest by wall time, mostly waiting on SLURM: beside the others from the start
    "tests/test_examples.py",
    "tests/test_collection_engine.py",
    "tests/test_torchrl_parity.py",
    "tests/test_inference.py",
    "tests/test_collection_checkpoint.py",
    "tests/test_weights_scheme.py",
    "tests/test_reattach.py",
    "tests/test_jobqueue.py",
    "tests/test_netns.py",
)


def pytest_collection_modifyitems(items: list) -> None:
    """Puts the longest files first (stable: each file's own order is kept)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=run_as_script), SkipParser()],
    patterns=["README.md", "docs/*.md"],
).pytest()
