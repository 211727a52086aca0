"""Across hosts: collection and weight fan-out over shaped links between simulated hosts.

Four worker hosts and a scheduler host, each a Linux network namespace on one
bridge (``tests/netns.py``); the driver is this process, in the caller's
namespace, so every batch and every weights version crosses a link. Each worker
host runs ``--workers-per-host`` single-threaded ``dask worker`` processes. The
links are shaped on every host's egress and on the driver's: ``netem`` with
``--delay-ms`` of latency and a ``--rate`` cap where the kernel has ``sch_netem``,
otherwise a token bucket (``tbf``) with the rate cap alone (the result says
which).

- **Collection** (P1-style): a 10 ms sleep-step env on every worker, sync and
  async, frames/s against the ideal (the collectors times one env stepping alone
  here), with the links shaped and unshaped, interleaved (``--pairs``).
- **Pixels** (``--parts pixels``): async collection of 4x84x84 uint8 observations
  (``StackedPixelEnvMaker``, a 1 ms sleep a step, 500-frame batches of 28 MB),
  shaped and open links interleaved: MB/s into the driver, and the share of the
  worker hosts' links (``--rate`` times ``--hosts``) that it uses.
- **Weights** (P3 over hosts): a ``--sizes-mb`` update to every collector on the
  first 1, 2, ... 4 hosts through the Dask route (one scatter, then host to host
  along daskcollect's tree; the driver's shared memory is off, as it is for other
  hosts), timed
  as in ``broadcast.py`` (update plus a one-frame sync batch, minus that batch),
  against one point-to-point transfer of the same payload to one worker, against
  Dask's own ``scatter(..., broadcast=True)`` to the same workers, and against a
  scatter to one worker followed by Dask's ``Client.replicate(...,
  branching_factor=2)`` to them (the transfers alone, no loading).

    python benchmarks/cross_host.py --pairs 3
    python benchmarks/cross_host.py --parts pixels --hosts 1 --workers-per-host 4 --pairs 3

Needs root and iproute2; prints why and writes nothing otherwise. Writes
benchmarks/results/cross_host.json and prints tables.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import dask
from _common import header, save
from broadcast import time_update
from distributed import Client
from driver_cost import measure, single_env_fps
from makers import BallastPolicy, SleepEnvMaker, StackedPixelEnvMaker
from netns import SimulatedHosts, has_netem, unavailable
from tensordict.nn import TensorDictModule

from daskcollect import DaskCollector
from daskcollect.weights import WeightsPayload, extract_weights

warnings.filterwarnings("ignore")

HOSTS = ["h1", "h2", "h3", "h4"]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--hosts", type=int, default=4, help="worker hosts (at most 4)")
parser.add_argument("--workers-per-host", type=int, default=2)
parser.add_argument("--delay-ms", type=float, default=1.0)
parser.add_argument("--rate", default="1gbit")
parser.add_argument("--step", type=float, default=0.01, help="seconds each env step sleeps")
parser.add_argument("--frames-per-rollout", type=int, default=20)
parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per collection run")
parser.add_argument("--pairs", type=int, default=3)
parser.add_argument("--sizes-mb", type=float, nargs="+", default=[10, 100])
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--warmup", type=int, default=1)
parser.add_argument(
    "--parts", nargs="+", choices=["collection", "pixels", "weights"], default=["collection", "weights"]
)
parser.add_argument("--out", default=None)


def shaping(args, netem: bool) -> list[str]:
    if netem:
        return ["netem", "delay", f"{args.delay_ms}ms", "rate", args.rate, "limit", "100000"]
    return ["tbf", "rate", args.rate, "burst", "512kb", "latency", "100ms"]


def start_cluster(rig: SimulatedHosts, args) -> str:
    """The scheduler and the workers; worker host ``k`` declares ``hosts<j>=1`` for every ``j >= k``,
    so ``worker_resources={"hosts<j>": 1}`` selects the workers of the first ``j`` hosts."""
    address = rig.scheduler("sched")
    for k, host in enumerate(HOSTS[: args.hosts], start=1):
        resources = ",".join(f"hosts{j}=1" for j in range(k, args.hosts + 1))
        rig.workers(host, address, args.workers_per_host, resources)
    with Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(args.hosts * args.workers_per_host, timeout=120)
    return address


def collection(rig: SimulatedHosts, address: str, args, qdisc: list[str]) -> dict:
    """Frames/s over ideal in both modes, shaped and unshaped links interleaved."""
    n = args.hosts * args.workers_per_host
    fpr = args.frames_per_rollout
    raw: dict[str, list[dict]] = {}
    for pair in range(args.pairs):
        ideal = n * single_env_fps(SleepEnvMaker(args.step))
        for shaped in (True, False):
            rig.shape(qdisc if shaped else None)
            for sync in (True, False):
                collector = DaskCollector(
                    SleepEnvMaker(args.step), None, frames_per_batch=fpr * n if sync else fpr, total_frames=-1,
                    num_collectors=n, sync=sync, client=address,
                )  # fmt: skip
                r = measure(collector, args.seconds, lambda: [])
                r["fps/ideal"] = r["fps"] / ideal
                side = f"{'sync' if sync else 'async'}-{'shaped' if shaped else 'open'}"
                raw.setdefault(side, []).append(r)
                print(f"pair {pair} {side:13s} {r['fps']:7.0f} frames/s  {r['fps/ideal']:.3f} of ideal  "
                      f"driver {r['driver_ms_per_batch']:.2f} ms/batch", flush=True)  # fmt: skip
    rig.shape(qdisc)
    summary = {
        side: {k: statistics.median(r[k] for r in runs) for k in ("fps", "fps/ideal", "driver_ms_per_batch")}
        for side, runs in raw.items()
    }
    return {"collectors": n, "raw": raw, "summary": summary}


def link_mb_per_s(rate: str) -> float:
    """A tc rate such as ``1gbit`` or ``100mbit`` in MB/s."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, bits in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * bits / 8 / 1e6
    raise ValueError(f"unknown rate {rate!r}")


def pixels(rig: SimulatedHosts, address: str, args, qdisc: list[str]) -> dict:
    """MB/s of pixel batches into the driver, and the share of the worker hosts' links it uses."""
    n, capacity = args.hosts * args.workers_per_host, link_mb_per_s(args.rate) * args.hosts
    raw: dict[str, list[dict]] = {}
    for pair in range(args.pairs):
        for shaped in (True, False):
            rig.shape(qdisc if shaped else None)
            collector = DaskCollector(
                StackedPixelEnvMaker(0.001), None, frames_per_batch=500, total_frames=-1, num_collectors=n,
                sync=False, client=address,
            )  # fmt: skip
            r = measure(collector, args.seconds, lambda: [])
            r["link_share"] = r["mb_per_s"] / capacity
            side = "shaped" if shaped else "open"
            raw.setdefault(side, []).append(r)
            print(f"pair {pair} pixels-{side:7s} {r['mb_per_s']:7.1f} MB/s  {r['link_share']:.3f} of the links  "
                  f"driver {r['driver_ms_per_mb']:.3f} ms/MB", flush=True)  # fmt: skip
    rig.shape(qdisc)
    keys = ("mb_per_s", "link_share", "driver_ms_per_mb")
    summary = {side: {k: statistics.median(r[k] for r in runs) for k in keys} for side, runs in raw.items()}
    return {"collectors": n, "capacity_mb_per_s": capacity, "raw": raw, "summary": summary}


def replicate(client: Client, payload: WeightsPayload, first: str, targets: list[str]) -> float:
    """Seconds of a scatter of ``payload`` to ``first``, then Dask's ``Client.replicate`` to every
    worker in ``targets`` (checked: each holds a copy when it returns)."""
    start = time.perf_counter()
    future = client.scatter(payload, workers=[first], direct=True, hash=False, timeout=300)
    client.replicate([future], n=len(targets), workers=targets, branching_factor=2, callback_timeout=300)
    elapsed = time.perf_counter() - start
    held = len(client.who_has([future])[future.key])
    future.release()
    if held < len(targets):
        raise RuntimeError(f"replicate left {held} of {len(targets)} copies")
    return elapsed


def transfers(address: str, payload: WeightsPayload, args) -> dict[int, dict[str, list[float]]]:
    """Per host count ``j``: seconds of one scatter of ``payload`` to one worker of the first host
    (``one``), of Dask's own ``scatter(..., broadcast=True)`` to every worker of the first ``j``
    hosts (``broadcast``), and of a scatter to that one worker then ``Client.replicate`` to every
    worker of the first ``j`` hosts (``replicate``), interleaved."""
    out: dict[int, dict[str, list[float]]] = {}
    with Client(address, timeout=30, set_as_default=False, direct_to_workers=True) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        for j in range(1, args.hosts + 1):
            targets = sorted(a for a, w in workers.items() if f"hosts{j}" in w["resources"])
            first = next(a for a in targets if "hosts1" in workers[a]["resources"])

            def scatter(where: list[str]) -> float:
                start = time.perf_counter()
                future = client.scatter(payload, workers=where, broadcast=len(where) > 1, direct=True,
                                        hash=False, timeout=300)  # fmt: skip
                elapsed = time.perf_counter() - start
                future.release()
                return elapsed

            runs = [
                (scatter([first]), scatter(targets), replicate(client, payload, first, targets))
                for _ in range(args.warmup + args.repeats)
            ]
            out[j] = {
                "one": [a for a, _, _ in runs[args.warmup :]],
                "broadcast": [b for _, b, _ in runs[args.warmup :]],
                "replicate": [c for _, _, c in runs[args.warmup :]],
            }
    return out


def fan_out(address: str, args) -> list[dict]:
    """Weight updates to the collectors of the first 1..hosts hosts, against one transfer and
    against Dask's own broadcast."""
    rows = []
    for mb in args.sizes_mb:
        module = BallastPolicy(int(mb * 1e6))
        policy = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
        payload = WeightsPayload.pack(extract_weights(policy), 0)
        for j, sides in transfers(address, payload, args).items():
            n = j * args.workers_per_host
            with dask.config.set({"daskcollect.weights.shared-memory": False}):
                update = time_update(address, module, policy, n, args.repeats, args.warmup,
                                     worker_resources={f"hosts{j}": 1})  # fmt: skip
            one, broadcast = statistics.median(sides["one"]), statistics.median(sides["broadcast"])
            replicated = statistics.median(sides["replicate"])
            r = {"size_mb": mb, "hosts": j, "collectors": n, "bytes": payload.nbytes,
                 "update_s": statistics.median(update), "p2p_s": one, "broadcast_s": broadcast,
                 "replicate_s": replicated, "update/p2p": statistics.median(update) / one,
                 "broadcast/p2p": broadcast / one, "replicate/p2p": replicated / one,
                 "raw_update_s": update, "raw_p2p_s": sides["one"], "raw_broadcast_s": sides["broadcast"],
                 "raw_replicate_s": sides["replicate"]}  # fmt: skip
            rows.append(r)
            print(f"{mb:6g} MB  {j} hosts ({n} collectors)  update {1e3 * r['update_s']:8.1f} ms  "
                  f"one transfer {1e3 * one:7.1f} ms  Dask broadcast {1e3 * broadcast:8.1f} ms  "
                  f"Dask replicate {1e3 * replicated:8.1f} ms  update/one {r['update/p2p']:5.2f}  "
                  f"broadcast/one {r['broadcast/p2p']:5.2f}  replicate/one {r['replicate/p2p']:5.2f}", flush=True)  # fmt: skip
    return rows


def main(args) -> dict | None:
    reason = unavailable()
    if reason:
        print(f"cross_host: skipped, {reason}")
        return None
    netem = has_netem()
    qdisc = shaping(args, netem)
    if not netem:
        print(f"cross_host: this kernel has no sch_netem: links capped at {args.rate} with no added latency")
    start = time.perf_counter()
    with SimulatedHosts(["sched", *HOSTS[: args.hosts]]) as rig:
        address = start_cluster(rig, args)
        rig.shape(qdisc)
        result = {
            **header("cross_host", args),
            "shaping": " ".join(qdisc),
            "netem": netem,
            "collection": collection(rig, address, args, qdisc) if "collection" in args.parts else None,
            "pixels": pixels(rig, address, args, qdisc) if "pixels" in args.parts else None,
            "weights": fan_out(address, args) if "weights" in args.parts else None,
            "seconds": time.perf_counter() - start,
        }
    print(f"{'side':14s} {'frames/s':>9s} {'of ideal':>9s} {'driver ms/batch':>16s}")
    for side, r in (result["collection"] or {"summary": {}})["summary"].items():
        print(f"{side:14s} {r['fps']:9.0f} {r['fps/ideal']:9.3f} {r['driver_ms_per_batch']:16.2f}")
    save(result, "cross_host", args.out)
    return result


if __name__ == "__main__":
    main(parser.parse_args())
