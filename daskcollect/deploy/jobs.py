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

import logging
import shutil
import subprocess
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
    """The jobs of the user's jobqueue cluster, if any, for the errors of a wait for workers.

    Args:
        cluster: The cluster object the user's ``Client`` was made from, or ``None``.
    """

    def __init__(self, cluster: Any):
        self.cluster = cluster

    def waiting(self) -> dict[str, JobState]:
        """The submitted jobs that are not running, by id."""
        ids = batch_jobs(self.cluster)
        if not ids:
            return {}
        known = slurm_states(ids)
        return {j: s for j, s in known.items() if s[0] not in ("RUNNING", "COMPLETING")}

    def explain(self, error: NotEnoughWorkersError) -> NotEnoughWorkersError:
        """``error``, or a :class:`JobsPendingError` naming the jobs that keep workers away."""
        waiting = self.waiting()
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
