"""P7: the driver's CPU per batch, and frames/s against the ideal, as collectors are added.

Setup, as in the scale issue: an env whose step sleeps --step seconds (almost
no CPU: ``SleepEnvMaker`` in ``tests/makers.py``), --frames-per-batch frames per
batch, async mode. For each collector count N, interleaved in one process:

- ``dask``: ``DaskCollector(sync=False)`` on a private LocalCluster (its
  nannies run in the driver process, its scheduler in a child process of the
  driver; with --scheduler-in-driver, in the driver process, as Dask's
  ``LocalCluster`` runs it), or with --external on a ``dask scheduler`` and
  ``dask worker`` processes started here;
- ``torchrl``: TorchRL's ``MultiAsyncCollector`` with the same env and batch.

Each run is timed for --seconds after its first batch. "Driver ms/batch" is the
driver process's CPU time (user + system, every thread) over that window,
divided by the batches yielded, also split by the driver's threads (Dask's event
loop, which reads the completion streams, the iteration, others); "fps / ideal" is frames/s over N x the frames/s
of one env stepping alone (1 / (step + its CPU), measured once). The
scheduler's own process, where it has one, is timed apart ("scheduler
ms/batch"). The
proportional set size (PSS) of the collector processes is summed at the end of
each run (psutil; shared library pages counted once across them).

    python benchmarks/driver_cost.py --collectors 8 16 32 --pairs 3
    python benchmarks/driver_cost.py --collectors 16 --external --pairs 3
    python benchmarks/driver_cost.py --collectors 8 16 --pairs 3 --with-dask-streams
    python benchmarks/driver_cost.py --env pixels --step 0.001 --collectors 4 8 --pairs 3

With ``--env pixels`` (4x84x84 uint8 observations, about 56 KB a transition with
``next``, 500-frame batches of about 28 MB) the table also gives MB/s into the
driver and the driver's CPU per MB.

Writes benchmarks/results/driver_cost[-external].json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import warnings

import dask
import psutil
from _common import header, medians, save
from distributed import Client
from makers import SleepEnvMaker, StackedPixelEnvMaker
from torchrl.collectors import MultiAsyncCollector

from daskcollect import DaskCollector

warnings.filterwarnings("ignore")


def env_maker(args):
    """The env: the sleep-step CartPole, or with ``--env pixels`` 4x84x84 uint8 observations."""
    return StackedPixelEnvMaker(args.step) if args.env == "pixels" else SleepEnvMaker(args.step)


def single_env_fps(maker, frames: int = 200) -> float:
    """Frames/s of one env stepping alone (random actions): the per-collector ideal."""
    env = maker()
    start = time.perf_counter()
    env.rollout(frames, break_when_any_done=False)
    return frames / (time.perf_counter() - start)


def pss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 1e6


#: The driver's threads by role: Dask's event loop (the client, and in a private
#: cluster its scheduler and nannies), which reads the completion streams of other hosts, the
#: same-host channels' reader, the iteration.
THREAD_ROLES = {"IO loop": "event_loop", "daskcollect-same-host": "same_host", "MainThread": "iteration"}
ROLES = (*THREAD_ROLES.values(), "other")


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads so far, summed by role."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        role = THREAD_ROLES.get(names.get(int(tid), ""), "other")
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_seconds(process: psutil.Process | None) -> float:
    return 0.0 if process is None else sum(process.cpu_times()[:2])


def measure(collector, seconds: float, pids, scheduler: psutil.Process | None = None) -> dict[str, float]:
    """Frames/s, batches (and per second) and the driver's CPU per batch over ``seconds`` after the
    first batch, in all and by thread role, the CPU per batch of the ``scheduler``'s process if it has
    one, and the PSS of the processes ``pids()`` names; shuts the collector down."""
    me = psutil.Process()
    try:
        it = iter(collector)
        first = next(it)
        per_frame = (
            first.bytes() / first.numel()
        )  # the same for every batch: counted once, outside the timing
        cpu0, threads0, frames, batches = sum(me.cpu_times()[:2]), thread_cpu(), 0, 0
        scheduler0 = cpu_seconds(scheduler)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            frames += next(it).numel()
            batches += 1
        elapsed = time.perf_counter() - start
        nbytes = frames * per_frame
        cpu = sum(me.cpu_times()[:2]) - cpu0
        scheduler_cpu = cpu_seconds(scheduler) - scheduler0
        threads = thread_cpu()
        split = {
            f"{role}_ms_per_batch": 1e3 * (threads.get(role, 0.0) - threads0.get(role, 0.0)) / batches
            for role in ROLES
        }
        return {"fps": frames / elapsed, "batches": batches, "batches_per_s": batches / elapsed,
                "driver_ms_per_batch": 1e3 * cpu / batches, **split, "mb_per_s": nbytes / 1e6 / elapsed,
                "driver_ms_per_mb": 1e3 * cpu / (nbytes / 1e6),
                "scheduler_ms_per_batch": 1e3 * scheduler_cpu / batches, "pss_mb": pss_mb(pids())}  # fmt: skip
    finally:
        collector.shutdown()


def children_of(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def run_dask(
    n: int, args, address: str | None, worker_pids, scheduler: psutil.Process | None, same_host: bool = True
) -> dict[str, float]:
    config = {
        "daskcollect.local-cluster.scheduler-process": not args.scheduler_in_driver,
        "daskcollect.streams.same-host": same_host,
    }
    with dask.config.set(config):
        collector = DaskCollector(
            env_maker(args), None, frames_per_batch=args.frames_per_batch, total_frames=-1,
            num_collectors=n, sync=False, client=address,
        )  # fmt: skip
    if address is None:  # the private cluster's scheduler process, if it has one
        scheduler = next(
            (p for p in psutil.Process().children() if "daskcollect.deploy.scheduler_process" in p.cmdline()),
            None,
        )
    return measure(collector, args.seconds, worker_pids or (lambda: children_of(os.getpid())), scheduler)


def run_torchrl(n: int, args) -> dict[str, float]:
    collector = MultiAsyncCollector(
        [env_maker(args)] * n, None, frames_per_batch=args.frames_per_batch, total_frames=-1
    )
    return measure(collector, args.seconds, lambda: children_of(os.getpid()))


def external_cluster(n: int) -> tuple[subprocess.Popen, subprocess.Popen, str]:
    """``dask scheduler`` and ``dask worker --nworkers n`` on loopback, as a user starts them."""
    exe = os.path.join(os.path.dirname(sys.executable), "dask")
    path = f"/tmp/daskcollect-p7-{os.getpid()}.json"
    if os.path.exists(path):
        os.remove(path)  # the previous pair's: its scheduler is gone
    scheduler = subprocess.Popen(
        [exe, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", path],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = subprocess.Popen(
        [exe, "worker", "--scheduler-file", path, "--nworkers", str(n), "--nthreads", "1", "--host",
         "127.0.0.1", "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"},
    )  # fmt: skip
    with Client(scheduler_file=path, timeout=60) as client:
        client.wait_for_workers(n, timeout=300)
        address = client.scheduler.address
    return scheduler, workers, address


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collectors", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--step", type=float, default=0.01, help="seconds each env step sleeps")
    parser.add_argument("--env", choices=["sleep", "pixels"], default="sleep")
    parser.add_argument("--frames-per-batch", type=int, default=None, help="default 20, 500 with pixels")
    parser.add_argument("--seconds", type=float, default=12.0, help="timed seconds per run")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--external", action="store_true", help="a dask scheduler process of its own")
    parser.add_argument(
        "--scheduler-in-driver",
        action="store_true",
        help="the private cluster's scheduler in the driver process",
    )
    parser.add_argument(
        "--with-dask-streams",
        action="store_true",
        help="also run with daskcollect.streams.same-host off (every rollout on its Dask stream)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.frames_per_batch is None:
        args.frames_per_batch = 500 if args.env == "pixels" else 20

    one = single_env_fps(env_maker(args))
    raw: dict[str, dict[str, list[dict]]] = {}
    for _ in range(args.pairs):
        for n in args.collectors:
            if args.external:
                scheduler, workers, address = external_cluster(n)
                try:
                    ours = run_dask(
                        n, args, address, lambda w=workers: children_of(w.pid), psutil.Process(scheduler.pid)
                    )
                finally:
                    stop(workers, scheduler)
            else:
                ours = run_dask(n, args, None, None, None)
            runs = [("dask", ours)]
            if args.with_dask_streams:
                runs.append(("dask_streams", run_dask(n, args, None, None, None, same_host=False)))
            runs.append(("torchrl", run_torchrl(n, args)))
            for side, r in runs:
                r["fps/ideal"] = r["fps"] / (n * one)
                raw.setdefault(str(n), {}).setdefault(side, []).append(r)
                print(f"N={n:3d} {side:8s} {r['fps']:8.0f} frames/s  fps/ideal {r['fps/ideal']:.3f}  driver "
                      f"{r['driver_ms_per_batch']:.2f} ms/batch  scheduler {r['scheduler_ms_per_batch']:.2f} "
                      f"ms/batch  PSS {r['pss_mb']:.0f} MB", flush=True)  # fmt: skip
    summary = medians(
        raw,
        (
            "driver_ms_per_batch",
            "scheduler_ms_per_batch",
            "fps/ideal",
            "pss_mb",
            "mb_per_s",
            "driver_ms_per_mb",
            *(f"{r}_ms_per_batch" for r in ROLES),
        ),
    )
    name = "driver_cost-external" if args.external else "driver_cost"
    name += "-scheduler-in-driver" if args.scheduler_in_driver else ""
    name += "-pixels" if args.env == "pixels" else ""
    save(
        {**header("P7-driver-cost", args), "single_env_fps": one, "raw": raw, "summary": summary},
        name,
        args.out,
    )
    print(f"{'N':>4} {'dask ms/b':>10} {'torchrl ms/b':>12} {'dask fps/ideal':>14} {'torchrl fps/ideal':>17}"
          f" {'dask PSS MB':>11} {'torchrl PSS MB':>14}")  # fmt: skip
    for n, r in summary.items():
        print(f"{n:>4} {r['dask_driver_ms_per_batch']:10.2f} {r['torchrl_driver_ms_per_batch']:12.2f} "
              f"{r['dask_fps/ideal']:14.3f} {r['torchrl_fps/ideal']:17.3f} {r['dask_pss_mb']:11.0f} "
              f"{r['torchrl_pss_mb']:14.0f}")  # fmt: skip
    for n, r in summary.items():
        print(f"{n:>4} MB/s dask {r['dask_mb_per_s']:.1f}, torchrl {r['torchrl_mb_per_s']:.1f}; driver ms/MB "
              f"dask {r['dask_driver_ms_per_mb']:.3f}, torchrl {r['torchrl_driver_ms_per_mb']:.3f}")  # fmt: skip
        if args.with_dask_streams:
            print(f"{n:>4} dask with same-host off: {r['dask_streams_driver_ms_per_batch']:.2f} ms/batch, "
                  f"fps/ideal {r['dask_streams_fps/ideal']:.3f}")  # fmt: skip
        split = ", ".join(f"{role} {r[f'dask_{role}_ms_per_batch']:.2f}" for role in ROLES)
        print(f"{n:>4} dask driver ms/batch by thread: {split}; scheduler process "
              f"{r['dask_scheduler_ms_per_batch']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
