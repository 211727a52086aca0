"""Central inference against per-collector inference, 8 collectors, the same cores (the central-inference issue).

    python benchmarks/central_inference.py --sizes 256 1024 2048 4096 --pairs 3 --total-frames 4000

One LocalCluster of ``collectors + 2`` worker processes serves every run, so both sides share the same
cores. Part ``ratio``, per size: CartPole with an MLP policy of 3 hidden layers of that width (argmax,
deterministic), ``--pairs`` interleaved pairs of runs in async mode: each collector with its own copy of
the policy, then ``inference="server"`` with one server, whose forward passes use ``--server-threads``
torch threads. The figure is frames/s after the first batch, and the central/per-collector ratio (median
of the pairs); the crossover is the smallest width where central inference wins
(benchmarks/results/central_inference.json). Part ``latency``: the action latency the collectors see
(p50 and p99, from request to answer) at ``--latency-width``, with 1 and 2 servers, for 1 collector and
for all (benchmarks/results/central_inference_latency.json). ``--device cuda`` puts the servers on the
GPU (``make bench-gpu``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _common import header, median_ratio, save
from distributed import Client, LocalCluster
from makers import make_cartpole
from tensordict.nn import TensorDictModule
from torch import nn

from daskcollect import DaskCollector
from daskcollect.inference.transport import latencies

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024], help="hidden widths")
parser.add_argument("--collectors", type=int, default=8)
parser.add_argument("--pairs", type=int, default=3)
parser.add_argument("--frames-per-batch", type=int, default=200)
parser.add_argument("--total-frames", type=int, default=8000)
parser.add_argument(
    "--server-threads", type=int, default=os.cpu_count(),
    help="inference_options['torch_threads']: the server's forward passes may use every core, which the "
    "collectors leave idle while they wait for their actions (default: this machine's cores)",
)  # fmt: skip
parser.add_argument(
    "--device", default=None,
    help="inference_options['device'] for the servers (cuda: the GPU check; the per-collector side stays on CPU)",
)  # fmt: skip
parser.add_argument(
    "--parts", nargs="+", choices=["ratio", "latency"], default=["ratio", "latency"],
    help="ratio: frames/s by width (central_inference.json); latency: the action latency "
    "(central_inference_latency.json)",
)  # fmt: skip
parser.add_argument("--latency-width", type=int, default=1024, help="the MLP width of the latency runs")
parser.add_argument("--out", default=None)
parser.add_argument(
    "--png", default=None, help="where to draw frames/s by width (docs/img/central_inference.png)"
)


class MLPArgmax(nn.Module):
    """CartPole's deterministic policy: ``layers`` hidden layers of ``width``, one-hot argmax action."""

    def __init__(self, width: int, layers: int = 3):
        super().__init__()
        sizes = [4] + [width] * layers
        blocks = [m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.Tanh())]
        self.net = nn.Sequential(*blocks, nn.Linear(sizes[-1], 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        logits = self.net(observation)
        return nn.functional.one_hot(logits.argmax(-1), 2).to(torch.int64)


def policy(width: int) -> TensorDictModule:
    torch.manual_seed(0)
    return TensorDictModule(MLPArgmax(width), in_keys=["observation"], out_keys=["action"])


def run(client: Client, args, width: int, servers: int, collectors: int | None = None) -> dict:
    """Frames/s of one collection after its first batch (``servers`` 0: per-collector inference)."""
    central = {}
    if servers:
        options = {"torch_threads": args.server_threads, "device": args.device}
        central = {"inference": "server", "inference_workers": servers, "inference_options": options}
    with DaskCollector(make_cartpole, policy(width), frames_per_batch=args.frames_per_batch,
                       total_frames=args.total_frames, num_collectors=collectors or args.collectors,
                       client=client, **central) as collector:  # fmt: skip
        batches = iter(collector)
        next(batches)
        start, frames = time.perf_counter(), 0
        for batch in batches:
            frames += batch.numel()
        fps = frames / (time.perf_counter() - start)
        out = {"fps": fps}
        if servers:
            out["servers"] = collector.stats()["inference"]
            names = {s["name"] for s in out["servers"]}
            seen = client.run(latencies, callback_timeout=60).values()
            samples = sorted(x for per in seen for name, s in per.items() if name in names for x in s)
            out["latency_ms_p50"] = 1000 * samples[len(samples) // 2]
            out["latency_ms_p99"] = 1000 * samples[min(int(len(samples) * 0.99), len(samples) - 1)]
    return out


def ratios(client: Client, args) -> dict:
    """Per width, interleaved pairs of per-collector and central runs, and their median ratio."""
    result = header("central_inference", args)
    result["sizes"] = {}
    for width in args.sizes:
        local, central = [], []
        for pair in range(args.pairs):
            order = [(local, 0), (central, 1)] if pair % 2 == 0 else [(central, 1), (local, 0)]
            for runs, servers in order:
                runs.append(run(client, args, width, servers))
        ratio = median_ratio([r["fps"] for r in central], [r["fps"] for r in local])
        result["sizes"][str(width)] = {
            "per_collector_fps": statistics.median(r["fps"] for r in local),
            "central_fps": statistics.median(r["fps"] for r in central),
            "ratio": ratio,
            "runs": {"per_collector": local, "central": central},
        }
        print(f"width {width}: central/per-collector {ratio:.2f}", flush=True)
    wins = [w for w in args.sizes if result["sizes"][str(w)]["ratio"] > 1.0]
    result["crossover_width"] = min(wins) if wins else None
    return result


def latency(client: Client, args) -> dict:
    """The action latency at ``--latency-width`` with 1 and 2 servers, for 1 collector and for all."""
    result = header("central_inference_latency", args)
    result["latency"] = {}
    for collectors in (1, args.collectors):
        for servers in (1, 2):
            r = run(client, args, args.latency_width, servers, collectors)
            result["latency"][f"{collectors} collectors, {servers} servers"] = r
            print(
                f"width {args.latency_width}, {collectors} collector(s), {servers} server(s): "
                f"p50 {r['latency_ms_p50']:.2f} ms, p99 {r['latency_ms_p99']:.2f} ms",
                flush=True,
            )
    return result


def main() -> None:
    args = parser.parse_args()
    workers = args.collectors + 2
    with LocalCluster(
        n_workers=workers, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        with Client(cluster) as client:
            if "ratio" in args.parts:
                result = ratios(client, args)
                save(result, "central_inference", args.out)
                if args.png:
                    plot(result, args.png)
            if "latency" in args.parts:
                out = None if args.out is None else args.out.replace(".json", "_latency.json")
                save(latency(client, args), "central_inference_latency", out)


def plot(result: dict, path: str) -> None:
    """Frames/s of both sides by MLP width, with the central/per-collector ratio over each width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted(int(w) for w in result["sizes"])
    sizes = [result["sizes"][str(w)] for w in widths]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(widths, [s["per_collector_fps"] for s in sizes], "o-", label="per-collector inference")
    ax.plot(widths, [s["central_fps"] for s in sizes], "s-", label='inference="server" (1 server)')
    for w, s in zip(widths, sizes):
        ax.annotate(f"{s['ratio']:.2f}x", (w, s["central_fps"]), textcoords="offset points", xytext=(-8, -14))
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("MLP width (3 hidden layers)")
    ax.set_ylabel("frames/s, 8 collectors, 2 cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print("drew", path)


if __name__ == "__main__":
    main()
