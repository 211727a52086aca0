"""daskcollect._imports: code run once a module is imported, and ``import daskcollect`` stays light."""

from __future__ import annotations

import sys

from helpers import fresh_python

from daskcollect._imports import on_import


def test_a_callback_runs_once_its_module_is_imported(tmp_path, monkeypatch):
    calls = []
    on_import("json", lambda: calls.append("json"))  # already imported: at once
    assert calls == ["json"]
    (tmp_path / "daskcollect_test_late.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    on_import("daskcollect_test_late", lambda: calls.append(sys.modules["daskcollect_test_late"].VALUE))
    assert calls == ["json"]
    import daskcollect_test_late  # noqa: F401

    assert calls == ["json", 1]


def test_import_daskcollect_loads_neither_torch_nor_distributed_until_torchrl_does():
    code = (
        "import sys, daskcollect\n"
        "print('torch' in sys.modules, 'distributed' in sys.modules)\n"
        "from torchrl.collectors import Collector\n"
        "print('dask' in type(Collector)._BACKENDS)\n"
    )
    assert fresh_python(code).strip().splitlines()[-2:] == ["False False", "True"]
