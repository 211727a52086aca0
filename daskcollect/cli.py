"""The ``daskcollect`` command: collect from a gymnasium env on a Dask cluster.

Examples:
    daskcollect run --env CartPole-v1 --collectors 2 --frames 20000
    daskcollect run --env Pendulum-v1 --collectors 4 --frames 100000 --sync
    daskcollect run --env CartPole-v1 --scheduler tcp://127.0.0.1:8786 --frames 50000
    daskcollect run --env CartPole-v1 --worker-env OMP_NUM_THREADS=1 --frames 10000
    daskcollect run --env CartPole-v1 --memmap-dir rollouts --frames 50000

Exit codes: 0 done, 1 error (one line on stderr), 2 bad arguments, 130 interrupted.
Set DASKCOLLECT_DEBUG=1 to see an error's traceback too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class GymEnvMaker:
    """A picklable constructor of a TorchRL ``GymEnv``."""

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self):
        from torchrl.envs import GymEnv

        return GymEnv(self.env_id)

    def __repr__(self) -> str:
        return f"GymEnvMaker({self.env_id!r})"


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="daskcollect",
        description="Collect TorchRL rollouts on a Dask cluster.",
        epilog=__doc__.split("Examples:")[1].join(["Examples:", ""]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="collect frames from a gymnasium env and report the throughput",
        epilog=__doc__.split("Examples:")[1].join(["Examples:", ""]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--env", required=True, help="a gymnasium env id, e.g. CartPole-v1")
    run.add_argument(
        "--collectors", type=_positive, default=None, help="collectors (default: one per worker/CPU)"
    )
    run.add_argument("--frames", type=_positive, default=20_000, help="total frames to collect")
    run.add_argument("--frames-per-batch", type=_positive, default=1000, help="frames per batch")
    run.add_argument("--sync", action="store_true", help="stack one share of every collector per batch")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, help="a scheduler address, e.g. tcp://127.0.0.1:8786")
    where.add_argument("--scheduler-file", default=None, help="a scheduler file")
    run.add_argument(
        "--worker-env",
        type=_key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="an environment variable for the workers (repeatable)",
    )
    run.add_argument(
        "--memmap-dir",
        default=None,
        metavar="D",
        help="workers write rollouts as memory maps under D (a folder every worker and this "
        "machine can reach; created if its parent exists); the batches are counted and released",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _check_env_id(env_id: str) -> None:
    import gymnasium

    try:
        gymnasium.spec(env_id)
    except Exception as exc:
        raise ValueError(
            f"unknown env id {env_id!r} ({exc}). Use a gymnasium id such as CartPole-v1."
        ) from None


def prepare_memmap_dir(path: str) -> bool:
    """Creates ``path`` if only it is missing (its parent exists).

    Whether it can be written is checked by ``DaskCollector`` itself, on this
    machine and on every worker (``daskcollect.collection.memmap.check_writable``).

    Returns:
        Whether the folder was created.

    Raises:
        ConfigurationError: If ``path`` is a file, or its parent is missing.
    """
    from daskcollect.errors import ConfigurationError

    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigurationError(f"--memmap-dir {path} is a file, not a folder. Pass a folder.")
    created = False
    if not folder.exists():
        if not folder.parent.is_dir():
            raise ConfigurationError(
                f"--memmap-dir {path}: its parent {folder.parent} is not a folder. Create the parent "
                "first, on a filesystem that every worker reaches, or pass an existing folder."
            )
        try:
            folder.mkdir()
        except OSError as exc:
            raise ConfigurationError(f"cannot create --memmap-dir {path}: {exc.strerror}.") from None
        created = True
    return created


def run(args: argparse.Namespace) -> int:
    _check_env_id(args.env)
    if args.memmap_dir and prepare_memmap_dir(args.memmap_dir):
        print(f"daskcollect: created {Path(args.memmap_dir).expanduser().resolve()}")
    start = time.perf_counter()
    private = None if args.scheduler or args.scheduler_file else _start_private_cluster(args)
    try:
        # torch and TorchRL load here (not for --help or a bad argument), while the
        # private cluster's workers import them too.
        from daskcollect import DaskCollector

        collector = DaskCollector(
            GymEnvMaker(args.env),
            frames_per_batch=args.frames_per_batch,
            total_frames=args.frames,
            sync=args.sync,
            num_collectors=args.collectors,
            client=private.client if private else args.scheduler,
            scheduler_file=args.scheduler_file,
            worker_env=dict(args.worker_env),
            output="memmap" if args.memmap_dir else "tensordict",
            memmap_dir=args.memmap_dir,
        )
        with collector:
            rows = _collect(args, collector, startup=time.perf_counter() - start)
    finally:
        if private is not None:
            private.close(timeout=30)
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return EXIT_OK


def _start_private_cluster(args: argparse.Namespace):
    """The private LocalCluster, started before this process imports torch (the two overlap)."""
    from dask.system import CPU_COUNT

    from daskcollect.collection.options import ClusterOptions
    from daskcollect.deploy.handle import connect
    from daskcollect.settings import Settings

    options = ClusterOptions(worker_env=dict(args.worker_env))
    return connect(options, n_workers=args.collectors or CPU_COUNT, settings=Settings.load())


def _collect(args: argparse.Namespace, collector, startup: float) -> list[tuple[str, object]]:
    """Runs the collection with a progress bar; returns the summary's rows."""
    from tqdm import tqdm

    from daskcollect.monitoring.scheduler import PATH as MONITOR_PATH

    ready = time.perf_counter()
    print(f"daskcollect: {collector.num_collectors} collectors on {len(set(collector.workers))} workers")
    links = _links(collector.dashboard_link, MONITOR_PATH)
    print("\n".join(f"{name + ':':<12} {link}" for name, link in links))
    bar = tqdm(total=args.frames, unit="frames", unit_scale=True, disable=args.no_progress, smoothing=0.1)
    frames = batches = 0
    for batch in collector:
        n = batch.numel()
        if args.memmap_dir:
            batch.release()  # a MemmapBatch handle: its folder can go
        frames += n
        batches += 1
        bar.update(min(n, bar.total - bar.n))
        stats = collector.stats()
        bar.set_postfix(batches=batches, restarts=stats["restarts"], collectors=stats["live_collectors"],
                        refresh=False)  # fmt: skip
    bar.close()
    seconds = time.perf_counter() - ready
    stats = collector.stats()
    return [
        ("env", args.env),
        ("mode", "sync" if args.sync else "async"),
        ("collectors", collector.num_collectors),
        ("batches", batches),
        ("frames", frames),
        ("start-up (s)", f"{startup:.1f}"),
        ("collection (s)", f"{seconds:.1f}"),
        ("frames/s", f"{frames / seconds:,.0f}"),
        ("restarts", stats["restarts"]),
        ("frames lost", stats["frames_lost"]),
        ("output", f"memmap in {args.memmap_dir}" if args.memmap_dir else "tensordict"),
        *links,
    ]


def _links(dashboard: str | None, monitor_path: str) -> list[tuple[str, str]]:
    """The dashboard's link and the collectors' page link (or why there is none)."""
    if not dashboard:
        return [("dashboard", "not available (install bokeh)")]
    base = dashboard.rsplit("/", 1)[0] if dashboard.endswith("/status") else dashboard.rstrip("/")
    return [("dashboard", dashboard), ("collectors", base + monitor_path)]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``daskcollect`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("daskcollect: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the promise: any failure is one line and exit code 1
        from daskcollect.errors import DaskCollectError

        lines = str(exc).strip().splitlines() or [""]
        name = "" if isinstance(exc, (DaskCollectError, ValueError)) else f"{type(exc).__name__}: "
        print(f"daskcollect: error: {name}{lines[0]}", file=sys.stderr)
        if os.environ.get("DASKCOLLECT_DEBUG"):
            traceback.print_exc()
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
