"""A script that starts a private cluster outside ``if __name__ == "__main__":`` fails at once, saying so."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_script(folder, source: str) -> subprocess.CompletedProcess:
    script = folder / "train.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, str(script)], cwd=folder, capture_output=True, text=True, timeout=120
    )


def test_unguarded_script_gets_the_fix_not_the_nanny_log(tmp_path):
    out = run_script(
        tmp_path,
        """
        from daskcollect import DaskCollector
        from makers import make_cartpole

        collector = DaskCollector(make_cartpole, frames_per_batch=100, total_frames=200, num_collectors=1)
        """,
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("daskcollect.errors.ConfigurationError: ") and "train.py, line 5" in last
    assert 'Put the code that creates the collector under `if __name__ == "__main__":`' in last
    assert "Nanny" not in out.stderr


def test_the_guard_is_found_through_calls(tmp_path):
    """Only the script's top-level statement counts: a call from main() under the guard passes."""
    out = run_script(
        tmp_path,
        """
        from daskcollect.deploy.main_guard import check_main_guard


        def main():
            check_main_guard()


        if __name__ == "__main__":
            main()
            print("guarded: ok")
        main()
        """,
    )
    assert out.stdout.strip() == "guarded: ok"
    assert out.returncode == 1 and "train.py, line 12, starts a private Dask cluster" in out.stderr
