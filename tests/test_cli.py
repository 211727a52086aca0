"""The ``daskcollect`` command: the README's main job, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import pytest
from helpers import fresh_python, noise

from daskcollect.cli import EXIT_ERROR, EXIT_OK, main


def test_run_against_a_scheduler(cluster, capsys):
    code = main(
        [
            "run",
            "--env",
            "CartPole-v1",
            "--frames",
            "2000",
            "--frames-per-batch",
            "500",
            "--scheduler",
            cluster.scheduler_address,
            "--no-progress",
            "--worker-env",
            "A=1",
        ]
    )
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "2 collectors on 2 workers" in out
    assert "frames          2000" in out and "batches         4" in out


def test_unknown_env_is_one_line(capsys):
    assert main(["run", "--env", "NoSuchEnv-v0", "--frames", "10"]) == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown env id 'NoSuchEnv-v0'" in err[0]


def test_bad_worker_env_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--env", "CartPole-v1", "--worker-env", "NOEQUALS"])
    assert info.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_unreachable_scheduler_is_one_line(capsys):
    with dask.config.set({"daskcollect.timeouts.connect": "1s"}):
        code = main(["run", "--env", "CartPole-v1", "--scheduler", "tcp://127.0.0.1:9", "--no-progress"])
    assert code == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Could not connect" in err[0]


def test_console_script_main_job():
    """The README's main job: a private LocalCluster, a progress bar, the dashboard link."""
    exe = os.path.join(os.path.dirname(sys.executable), "daskcollect")
    out = subprocess.run(
        [exe, "run", "--env", "CartPole-v1", "--collectors", "2", "--frames", "4000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dashboard:   http://127.0.0.1:" in out.stdout
    assert out.stdout.count("/daskcollect") == 2  # the collectors' page, at the start and the end
    assert "frames/s" in out.stderr  # tqdm draws on stderr
    assert "frames          4000" in out.stdout
    assert "--help" not in out.stderr
    assert not noise(out.stderr), out.stderr[-2000:]  # a quiet run
    help_out = subprocess.run([exe, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert "Examples:" in help_out.stdout and "--scheduler" in help_out.stdout


def test_memmap_dir_and_scheduler_file(cluster, tmp_path, capsys):
    sched = tmp_path / "scheduler.json"
    sched.write_text(json.dumps({"address": cluster.scheduler_address}))
    out_dir = tmp_path / "rollouts"
    code = main(["run", "--env", "CartPole-v1", "--frames", "2000", "--frames-per-batch", "500",
                 "--scheduler-file", str(sched), "--memmap-dir", str(out_dir), "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out
    assert code == EXIT_OK, captured.err
    assert "frames          2000" in out and f"memmap in {out_dir}" in out
    assert "restarts        0" in out
    assert f"daskcollect: created {out_dir}" in out  # a missing folder whose parent exists
    assert os.path.isdir(out_dir) and not os.listdir(out_dir)  # every batch released, folders gone


@pytest.mark.parametrize("where", ["under-a-file", "missing-parent", "a-file"])
def test_unusable_memmap_dir_is_one_line(tmp_path, capsys, where):
    a_file = tmp_path / "file"
    a_file.write_text("")
    path = {
        "under-a-file": a_file / "rollouts",
        "missing-parent": tmp_path / "no" / "rollouts",
        "a-file": a_file,
    }[where]
    code = main(["run", "--env", "CartPole-v1", "--memmap-dir", str(path), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_ERROR
    assert len(err) == 1 and err[0].startswith("daskcollect: error: --memmap-dir"), err
    assert not (tmp_path / "no").exists()


def test_help_does_not_import_torch():
    """--help answers without loading torch (its time is in benchmarks/startup.py)."""
    code = (
        "import sys\n"
        "from daskcollect.cli import main\n"
        "try:\n    main(['run', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "print('torch' in sys.modules, 'distributed' in sys.modules)"
    )
    assert fresh_python(code).splitlines()[-1] == "False False"
