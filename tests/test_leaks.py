"""The leak check (tests/leaks.py) counts what this session's processes made, not another suite's."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

from helpers import SHARED_MEMORY
from leaks import machine, ours


def test_a_shared_memory_file_is_the_sessions_when_its_creator_is_one_of_its_processes_or_is_gone():
    own = {os.getpid()}
    assert ours(f"daskcollect-{os.getpid()}-{uuid.uuid4().hex[:8]}", own)
    assert not ours("daskcollect-1-0a1b2c3d", own)  # pid 1 lives and is not ours: another suite's
    ended = subprocess.Popen(["true"])
    ended.wait(timeout=10)
    assert ours(f"daskcollect-{ended.pid}-0a1b2c3d", own)  # ours and died before it could be seen


def test_the_check_does_not_see_another_live_processs_files():
    foreign = os.path.join(SHARED_MEMORY, f"daskcollect-1-{uuid.uuid4().hex[:8]}")
    mine = os.path.join(SHARED_MEMORY, f"daskcollect-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(foreign)
    os.makedirs(mine)
    try:
        seen = machine()["shared-memory files"]
        assert os.path.basename(mine) in seen and os.path.basename(foreign) not in seen
    finally:
        shutil.rmtree(foreign)
        shutil.rmtree(mine)
