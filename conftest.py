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


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=run_as_script), SkipParser()],
    patterns=["README.md", "docs/*.md"],
).pytest()
