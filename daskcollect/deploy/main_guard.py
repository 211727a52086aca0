"""The ``if __name__ == "__main__":`` check made before a private cluster starts.

A private ``LocalCluster`` starts its worker processes with ``spawn`` (Dask's
default ``distributed.worker.multiprocessing-method``). A spawned process
imports the driver's script again; if the code that built the collector is
not under the ``__main__`` guard, that import tries to start processes of its
own, and Dask ends with a long nanny log and ``Nanny failed to start``. This
module reads the script's source to tell the user before any process starts.
"""

from __future__ import annotations

import ast
import inspect
import sys
from types import FrameType

import dask

from daskcollect.errors import ConfigurationError


def check_main_guard(frame: FrameType | None = None) -> None:
    """Raises if the running script creates a private cluster outside its ``__main__`` guard.

    Interactive sessions, notebooks, ``python -c`` and the ``fork`` start method
    pass: nothing is imported again there.

    Args:
        frame: Where to start looking up the stack (default: the caller's).

    Raises:
        ConfigurationError: If the script's top-level statement that led here
            is not inside ``if __name__ == "__main__":``.
    """
    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not str(path).endswith(".py"):
        return
    line = _top_level_line(main.__dict__, frame or inspect.currentframe().f_back)
    if line is None or main.__name__ == "__main__" and _guarded(path, line):
        return
    raise ConfigurationError(
        f'{path}, line {line}, starts a private Dask cluster outside `if __name__ == "__main__":`. '
        "Its worker processes are spawned and import this script again, so each would try to start "
        "a cluster of its own. Put the code that creates the collector under "
        '`if __name__ == "__main__":`, or pass client= a cluster started elsewhere.',
        path=path,
        line=line,
    )


def _top_level_line(main_globals: dict, frame: FrameType | None) -> int | None:
    """The line of the outermost module-level frame of ``__main__`` on the stack, if any."""
    line = None
    while frame is not None:
        if frame.f_globals is main_globals and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    return line


def _guarded(path: str, line: int) -> bool:
    """Whether ``line`` of the script at ``path`` lies inside an ``if __name__ == "__main__":`` body."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return True  # unreadable source: do not second-guess the user
    for node in ast.walk(tree):
        # From the `if` line (a line number that points at the test itself can only come from
        # a source edited since it started) to the end of the body (not the `else:`).
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
                return True
    return False


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]
