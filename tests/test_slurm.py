"""Collection on a real SLURM (one node on 127.0.0.1, ``tools/slurm.sh``), through dask-jobqueue's ``SLURMCluster``.

What SLURM does to jobs, done for real: ``scancel``, an early ``USR1`` notice to the
batch shell (``--signal=B:USR1``), preemption by a job of a
higher-priority partition, walltimes ended by ``--lifetime``, and jobs that
stay pending. Each run audits its frames: every batch full, no rollout twice,
nothing lost. Skipped, with the reason, only where SLURM's packages are not
installed (``.ci/run`` installs them) or the daemons cannot run as root.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import dask
import pytest
from distributed import Client
from helpers import noise, slurm_unavailable, wait_until
from makers import SleepEnvMaker, make_cartpole

from daskcollect import DaskCollector
from daskcollect.errors import JobsPendingError, NotEnoughWorkersError

jobqueue = pytest.importorskip("dask_jobqueue", reason="the 'jobqueue' extra is not installed")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "slurm.sh")
FAST = {"daskcollect.restart-delay": "0.2s"}


def jobs() -> list[str]:
    """The ids of the jobs SLURM knows, pending or running."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.split()


def state(job: str) -> str:
    """SLURM's state of a job, ended ones included while it remembers them."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30)
    fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
    return fields.get("JobState", "")


@pytest.fixture(scope="module")
def slurm():
    """SLURM up for this file's tests (started here if it was not), and no job of ours left after each."""
    reason = slurm_unavailable()
    if reason is not None:
        pytest.skip(reason)
    was_up = subprocess.run([SCRIPT, "status"], timeout=60).returncode == 0
    subprocess.run([SCRIPT, "start"], timeout=120, check=True)
    assert jobs() == [], "SLURM already runs jobs that are not this file's"
    yield
    if not was_up:
        subprocess.run([SCRIPT, "stop"], timeout=120, check=True)


@pytest.fixture
def slurm_cluster(slurm, tmp_path):
    """Builds ``SLURMCluster``s whose workers suit collectors; closes them and checks no job is left."""
    made = []

    def make(**kwargs):
        options = dict(
            cores=1, processes=1, memory="1GB", walltime="00:10:00", interface="lo",
            log_directory=str(tmp_path), python=f"exec {sys.executable}",
            scheduler_options={"dashboard_address": ":0"},  # 8787 may be another test's
            worker_extra_args=["--resources", "collector=1"],
        )  # fmt: skip
        options.update(kwargs)
        made.append(jobqueue.SLURMCluster(**options))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()
    assert wait_until(lambda: jobs() == [], timeout=60), f"jobs left: {jobs()}"


def following(client: Client, step: float, total_frames: int = -1) -> DaskCollector:
    """A collector on every job's worker (``num_collectors="auto"``): 100-frame batches of CartPole whose
    step sleeps ``step`` seconds, so that a rollout is in flight whenever a job ends."""
    return DaskCollector(SleepEnvMaker(step), frames_per_batch=100, total_frames=total_frames, num_collectors="auto",
                         worker_resources={"collector": 1}, client=client, py_modules=["makers"])  # fmt: skip


def audit(batches, frames_per_batch: int) -> None:
    """Every batch full, and no rollout (collector, rollout id) twice."""
    assert all(b.numel() == frames_per_batch for b in batches)
    pairs = [(int(b["collector", "collector_id"][0]), int(b["collector", "rollout_id"][0])) for b in batches]
    assert len(pairs) == len(set(pairs)), "a rollout came twice"


def test_collect_on_slurm_jobs_sync_and_async_with_exact_frames(slurm_cluster):
    cluster = slurm_cluster()
    cluster.scale(jobs=2)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        client.wait_for_workers(2, timeout=60)
        common = dict(frames_per_batch=200, total_frames=2000, num_collectors=2, client=client,
                      worker_resources={"collector": 1})  # fmt: skip
        with DaskCollector(make_cartpole, sync=True, **common) as collector:
            sync = list(collector)
        with DaskCollector(make_cartpole, sync=False, **common) as collector:
            batches = list(collector)
            stats = collector.stats()
    assert [tuple(b.shape) for b in sync] == [(2, 100)] * 10  # frames_per_batch split between 2 collectors
    assert sum(b.numel() for b in batches) == 2000 and stats["frames"] == 2000
    audit(batches, 200)
    assert {int(i) for b in batches for i in b["collector", "collector_id"].unique()} == {0, 1}
    assert stats["rollouts_lost"] == 0 and stats["restarts"] == 0
    assert stats["jobs_waiting"] == {}  # on the dashboard too, as "jobs not started"
    assert set(stats["worker_seconds_per_kframe"]) == {"collector=1"}


#: How SLURM tells a job it ends: ``scancel``'s SIGTERM to every process of the job, or what
#: ``#SBATCH --signal=B:USR1@120`` sends, SIGUSR1 to the batch shell alone. The job script ``exec``s
#: ``dask worker`` (``python="exec ..."``), so that shell is the nanny, which passes it to its worker.
NOTICES = {"scancel": ["scancel"], "B:USR1": ["scancel", "--batch", "--signal=USR1"]}


@pytest.mark.parametrize("notice", list(NOTICES))
def test_a_jobs_end_notice_retires_its_collector_gracefully_and_loses_nothing(slurm_cluster, notice):
    """The rollout in flight is delivered, then the worker leaves; the collection goes on without it."""
    cluster = slurm_cluster()
    cluster.scale(jobs=2)
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        client.wait_for_workers(2, timeout=60)
        with following(client, 0.005, total_frames=1200) as collector:
            it = iter(collector)
            batches = [next(it), next(it)]
            job = next(iter(cluster.workers.values())).job_id
            signalled = time.monotonic()
            subprocess.run([*NOTICES[notice], job], timeout=30, check=True)
            assert wait_until(lambda: batches.append(next(it)) or collector.stats()["retired"] == 1, 60, 0)
            to_retirement = time.monotonic() - signalled
            batches += list(it)
            stats = collector.stats()
    print(f"{notice} to retirement: {to_retirement:.2f} s")
    assert to_retirement < 30  # within SLURM's KillWait: before the SIGKILL
    assert sum(b.numel() for b in batches) == 1200 and stats["frames"] == 1200
    audit(batches, 100)
    assert stats["retired"] == 1 and stats["rollouts_lost"] == 0 and stats["restarts"] == 0


class Records(logging.Handler):
    """Keeps the messages of the records it gets."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("num_collectors", [1, "auto"])
def test_jobs_pending_in_the_queue_end_the_wait_with_their_states(slurm_cluster, num_collectors):
    """A job SLURM holds back (here a begin time an hour away): a typed error names it and SLURM's reason."""
    cluster = slurm_cluster(job_extra_directives=["--begin=now+3600"])
    cluster.scale(jobs=1)
    assert wait_until(lambda: len(jobs()) == 1, timeout=30)
    started, said = time.monotonic(), Records()
    logging.getLogger("daskcollect.deploy.jobs").addHandler(said)
    with (
        Client(cluster, set_as_default=False) as client,
        dask.config.set({"daskcollect.timeouts.workers": "3s"}),
        pytest.raises(JobsPendingError) as caught,
    ):
        DaskCollector(make_cartpole, frames_per_batch=100, total_frames=1000, num_collectors=num_collectors,
                      worker_resources={"collector": 1}, client=client)  # fmt: skip
    assert time.monotonic() - started < 30
    job = jobs()[0]
    assert caught.value.jobs == {job: "PENDING (BeginTime)"}
    assert f"job {job} PENDING (BeginTime)" in str(caught.value)
    assert isinstance(caught.value, NotEnoughWorkersError)  # what callers that wait for workers catch
    # While it waited, it said why (every timeouts.workers / 2, here 1.5 s).
    logging.getLogger("daskcollect.deploy.jobs").removeHandler(said)
    assert (
        f"daskcollect: waiting for workers; batch jobs not started: job {job} PENDING (BeginTime)"
        in said.messages
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_jobs_ended_by_their_lifetime_are_replaced_and_lose_nothing(slurm_cluster):
    """dask-jobqueue's walltime pattern: ``--lifetime`` under the job's walltime, and ``adapt``.

    Each job retires gracefully at 15-25 s and a fresh job replaces it, until
    both job slots have done so twice. Nothing is lost, no rollout comes twice,
    every frame is counted, and collection goes on with the replacements.
    """
    cluster = slurm_cluster(
        walltime="00:01:00",
        worker_extra_args=["--resources", "collector=1", "--lifetime", "20s", "--lifetime-stagger", "5s"],
    )
    cluster.adapt(minimum_jobs=2, maximum_jobs=2)
    batches, submitted = [], set()
    # Two jobs may end together: their replacements wait in SLURM's queue and start Python meanwhile.
    patient = {**FAST, "daskcollect.timeouts.workers": "90s"}
    with Client(cluster, set_as_default=False) as client, dask.config.set(patient):
        client.wait_for_workers(2, timeout=60)
        with following(client, 0.01) as collector:
            started, after = time.monotonic(), 0
            for batch in collector:
                batches.append(batch)
                submitted.update(jobs())
                after += collector.stats()["retired"] >= 4  # then 10 batches more
                if after > 10 or time.monotonic() - started > 150:
                    break
            stats = collector.stats()
    print(f"{len(submitted)} jobs over {len(batches)} batches; {stats['retired']} retired")
    audit(batches, 100)
    assert stats["frames"] == 100 * len(batches)
    assert stats["rollouts_lost"] == 0 and stats["restarts"] == 0
    assert stats["retired"] >= 4, f"{stats['retired']} jobs retired in 150 s"
    assert len(submitted) >= 6  # the first two and their four replacements
    ids = {int(i) for b in batches for i in b["collector", "collector_id"].unique()}
    assert len(ids) >= 5  # a collector per job: the 10 last batches come from replacements


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_preempted_job_retires_its_collector_gracefully(slurm_cluster):
    """A job of the higher-priority partition needs a worker's core: SLURM cancels that worker's job
    (SIGTERM, then SIGKILL after the partition's 30 s GraceTime). Its rollout in flight is delivered."""
    cluster = slurm_cluster()
    cluster.scale(jobs=2)
    batches = []
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        client.wait_for_workers(2, timeout=60)
        workers = jobs()
        with following(client, 0.005) as collector:
            batches += [next(iter(collector))]
            preemptor = subprocess.run(
                ["sbatch", "--parsable", "-p", "high", "-c", str(8 - len(workers) + 1), "-o", os.devnull,
                 "--wrap", "sleep 1"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout.strip()  # fmt: skip
            for batch in collector:  # SLURM cancels a job about 40 s after the preemptor's submission here
                batches.append(batch)
                if collector.stats()["retired"] == 1:
                    break
            batches += [b for _, b in zip(range(5), collector)]
            stats = collector.stats()

    def preempted() -> list[str]:  # SLURM marks the job once it has ended
        return [j for j in workers if state(j) == "PREEMPTED"]

    assert wait_until(preempted, timeout=30), f"job {preemptor} preempted none of {workers}"
    assert len(preempted()) == 1
    audit(batches, 100)
    assert stats["frames"] == 100 * len(batches)
    assert stats["retired"] == 1 and stats["rollouts_lost"] == 0 and stats["restarts"] == 0


def running() -> int:
    """SLURM jobs running now."""
    out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return len(out.stdout.split())


@pytest.mark.timeout(300)
def test_adapt_follows_a_learner_whose_pace_changes_4x(slurm_cluster):
    """Dask's Adaptive, told the collectors the learner needs, submits and retires jobs to match.

    A collector makes about 90 frames/s; the learner holds each 100-frame
    batch 1 s (about 2 collectors wanted), then 0.25 s (6 wanted; ``maximum_jobs``
    is 4), then 1 s again. Each phase lasts until the running jobs match,
    bounded by a minute.
    """
    cluster = slurm_cluster()
    cluster.adapt(minimum_jobs=1, maximum_jobs=4, interval="1s", wait_count=3)
    phases = [(1.0, lambda n, wanted: wanted == 2 and n == 2), (0.25, lambda n, wanted: n == 4),
              (1.0, lambda n, wanted: n == 2)]  # fmt: skip
    took, pairs, frames = [], set(), 0
    with Client(cluster, set_as_default=False) as client, dask.config.set(FAST):
        client.wait_for_workers(1, timeout=60)
        with following(client, 0.01) as collector:
            batches = iter(collector)
            for hold, matched in phases:
                started = time.monotonic()
                while time.monotonic() - started < 60:
                    batch = next(batches)
                    pairs.add(
                        (int(batch["collector", "collector_id"][0]), int(batch["collector", "rollout_id"][0]))
                    )
                    frames += batch.numel()
                    time.sleep(hold)  # the learner's work
                    stats = collector.stats()
                    if matched(running(), stats["wanted_collectors"]):
                        took.append(round(time.monotonic() - started, 1))
                        break
                else:
                    pytest.fail(f"jobs did not follow within 60 s: {running()} running, {stats['wanted_collectors']} "
                                f"wanted at {hold} s a batch; phases so far took {took}")  # fmt: skip
            stats = collector.stats()
    print(f"jobs followed the learner in {took} s")
    assert frames == stats["frames"] == 100 * len(pairs)  # every frame counted, no rollout twice
    assert (
        stats["rollouts_lost"] == 0 and stats["restarts"] == 0 and stats["retired"] >= 1
    )  # closed gracefully


def docs_example() -> str:
    """The runnable block of docs/slurm.md (the one its skip comment sends here)."""
    text = open(os.path.join(ROOT, "docs", "slurm.md")).read()
    after = text.split("tests/test_slurm.py, which starts it", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.timeout(200)
def test_the_docs_slurm_example_runs_as_written(slurm, tmp_path):
    script = tmp_path / "slurm_example.py"
    script.write_text(docs_example())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "DASK_"))}
    env["DASK_JOBQUEUE__SLURM__SCHEDULER_OPTIONS"] = (
        '{"dashboard_address": ":0"}'  # 8787 may be another test's
    )
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert not noise(out.stderr), out.stderr[-4000:]
    assert out.stdout.startswith("5000 frames; {'collector=1': ")
    assert wait_until(lambda: jobs() == [], timeout=60), f"the example left jobs: {jobs()}"
