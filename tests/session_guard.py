"""A Dask preload of the session cluster's scheduler and nannies (``tests/conftest.py``): each dies
with the test session that started it.

They are not ``multiprocessing`` children of the session, so nothing else ends them if pytest is
killed (a CI timeout, Ctrl-C twice); their worker processes end with their nanny, as Dask's do.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def dask_setup(server) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the session was gone before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)
