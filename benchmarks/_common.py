"""What every benchmark script shares: the result header (machine, versions, date), where results go,
and the test suite's folder on the path (its simulated hosts and its env makers)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

#: The test suite's folder: its simulated hosts (``tests/netns.py``) and env makers (``tests/makers.py``)
#: are not part of the installed package. Workers unpickle the makers by reference, so every process
#: started from here (``dask worker``, a cluster's workers, scripts) finds them on ``PYTHONPATH``.
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
if TESTS not in sys.path:
    sys.path.append(TESTS)
if TESTS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)


def header(benchmark: str, args: Any) -> dict[str, Any]:
    """The machine, versions, date and arguments of a run."""
    import dask
    import distributed
    import tensordict
    import torch
    import torchrl

    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": platform.node(),
        "cores": os.cpu_count(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "dask": dask.__version__,
            "distributed": distributed.__version__,
        },
        "args": vars(args),
    }


def save(result: dict[str, Any], name: str, out: str | None = None) -> str:
    """Writes ``result`` as JSON to ``out`` or ``benchmarks/results/<name>.json``."""
    path = out or os.path.join(RESULTS, f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print("wrote", path)
    return path


def median_ratio(a: list[float], b: list[float]) -> float:
    """The median of the pairwise ratios a[i] / b[i] (interleaved runs)."""
    return statistics.median(x / y for x, y in zip(a, b))


def medians(raw: dict[str, dict[str, list[dict]]], keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """``{n: {side_key: median}}`` from ``raw[n][side]``, a list of runs each holding ``keys``."""
    return {
        n: {
            f"{side}_{key}": statistics.median(r[key] for r in runs)
            for side, runs in sides.items()
            for key in keys
        }
        for n, sides in raw.items()
    }
