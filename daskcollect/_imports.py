"""Running code when a module is imported: how ``import daskcollect`` adds TorchRL's ``"dask"`` backend.

``import daskcollect`` stays light (no torch, no distributed: a Dask
scheduler imports daskcollect's plugins, and ``daskcollect run --help`` answers
without them). What must happen once TorchRL's collectors exist
(:mod:`daskcollect.collection.backend`) waits here for their import. Only the
standard library's import system is touched.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


def on_import(module: str, callback: Callable[[], None]) -> None:
    """Runs ``callback`` once ``module`` is imported: now if it is, else right after its import.

    TorchRL's backends are closed sets with no registry, so a new one is added
    to them; doing it when TorchRL loads keeps ``import daskcollect`` from
    importing torch (a Dask scheduler imports daskcollect's plugins).
    """
    if module in sys.modules:
        callback()
        return
    finder = _AfterImport(module, callback)
    sys.meta_path.insert(0, finder)


class _AfterImport(importlib.abc.MetaPathFinder):
    """A meta-path finder that lets the real finder find ``module``, then runs a callback after it loads."""

    def __init__(self, module: str, callback: Callable[[], None]) -> None:
        self.module, self.callback = module, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # once, and the real finders find it
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_register(module: Any) -> None:
            exec_module(module)
            callback()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec
