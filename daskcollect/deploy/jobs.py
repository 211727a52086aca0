"""The batch jobs behind a dask-jobqueue cluster's workers: which of them wait in the queue, and why.

Runs on the driver. A worker that never joins is, on HPC, most often a job
that SLURM keeps pending (no free node, a reservation, a begin time, a
limit). Waiting for workers then ends in :class:`~daskcollect.errors.JobsPendingError`,
which names those jobs and the reason SLURM gives, instead of a bare count.
The jobs come from the user's ``SLURMCluster`` (``Client(cluster).cluster``);
their states from ``squeue``. Other job schedulers' jobs are named without a
state.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

from daskcollect.errors import JobsPendingError, NotEnoughWorkersError

logger = logging.getLogger(__name__)

#: What the job scheduler says of a job: its state and, when pending, the reason.
JobState = tuple[str, str]


def batch_jobs(cluster: Any) -> list[str]:
    """The ids of the jobs a dask-jobqueue cluster has submitted (none for other clusters)."""
    workers = getattr(cluster, "workers", None)
    if cluster is None or getattr(cluster, "job_cls", None) is None or not isinstance(workers, dict):
        return []
    return [str(job.job_id) for job in list(workers.values()) if getattr(job, "job_id", None)]


def slurm_states(job_ids: list[str], timeout: float = 10.0) -> dict[str, JobState]:
    """``squeue``'s state and reason for each job it still knows (``{}`` without ``squeue``)."""
    if not job_ids or shutil.which("squeue") is None:
        return {}
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r"],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("squeue: %s", exc)
        return {}
    states = {}
    for line in out.stdout.splitlines():
        job, state, reason = (line.split("|") + ["", ""])[:3]
        states[job.strip()] = (state.strip(), reason.strip())
    return states


class BatchJobs:
    """The jobs of the user's jobqueue cluster, if any: for a wait's log and error, and for the stats.

    Args:
        cluster: The cluster object the user's ``Client`` was made from, or ``None``.
        report_every: Seconds between :meth:`reporting`'s log lines.
        max_age: Seconds a reading of the jobs' states is reused (``squeue`` asks the controller).
    """

    def __init__(self, cluster: Any, report_every: float = 10.0, max_age: float = 5.0):
        self.cluster = cluster
        self.report_every = report_every
        self.max_age = max_age
        self._read: tuple[float, dict[str, JobState]] = (-float("inf"), {})

    @property
    def batch(self) -> bool:
        """Whether the workers come from batch jobs (a dask-jobqueue cluster)."""
        return getattr(self.cluster, "job_cls", None) is not None

    def waiting(self, fresh: bool = False) -> dict[str, JobState]:
        """The submitted jobs that are not running, by id (read at most every ``max_age`` seconds)."""
        at, states = self._read
        if fresh or time.monotonic() - at > self.max_age:
            ids = batch_jobs(self.cluster)
            known = slurm_states(ids) if ids else {}
            states = {j: s for j, s in known.items() if s[0] not in ("RUNNING", "COMPLETING")}
            self._read = (time.monotonic(), states)
        return states

    def described(self) -> dict[str, str]:
        """:meth:`waiting` as ``{job id: "PENDING (Resources)"}``, for the stats and the dashboard."""
        return {
            j: f"{state} ({reason})" if reason else state for j, (state, reason) in self.waiting().items()
        }

    @contextlib.contextmanager
    def reporting(self) -> Iterator[None]:
        """Logs the jobs that keep workers away, every ``report_every`` seconds, while the block waits."""
        if not self.batch:
            yield
            return
        done = threading.Event()

        def report() -> None:
            while not done.wait(self.report_every):
                waiting = self.described()
                if waiting:
                    listed = ", ".join(f"job {j} {s}" for j, s in waiting.items())
                    logger.warning("daskcollect: waiting for workers; batch jobs not started: %s", listed)

        thread = threading.Thread(target=report, name="daskcollect-jobs", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=self.report_every)

    def explain(self, error: NotEnoughWorkersError) -> NotEnoughWorkersError:
        """``error``, or a :class:`JobsPendingError` naming the jobs that keep workers away."""
        waiting = self.waiting(fresh=True)
        if not waiting:
            return error
        listed = ", ".join(
            f"job {j} {state} ({reason or 'no reason given'})" for j, (state, reason) in waiting.items()
        )
        return JobsPendingError(
            f"{error} The cluster's batch jobs have not started: {listed}. The job scheduler keeps them "
            "waiting for the reason given: free the resources, shorten the walltime or change the "
            "partition, or cancel them (cluster.scale(0)).",
            jobs={j: f"{state} ({reason})" for j, (state, reason) in waiting.items()},
            **error.details,
        )
