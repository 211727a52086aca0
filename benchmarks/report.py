"""Turns benchmarks/results/*.json into the tables and the plot of docs/benchmarks.md.

    python benchmarks/report.py

Writes docs/img/benchmarks.png, scale.png and cross_host.png, and replaces the text between the
``<!-- report -->`` and ``<!-- /report -->`` markers of docs/benchmarks.md.
A result file that is missing leaves its row out.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

from _common import RESULTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
SCALE_PNG = os.path.join(ROOT, "docs", "img", "scale.png")
PNG = os.path.join(ROOT, "docs", "img", "benchmarks.png")
CROSS_HOST_PNG = os.path.join(ROOT, "docs", "img", "cross_host.png")


def load(name: str) -> dict | None:
    path = os.path.join(RESULTS, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def throughput_rows() -> list[str]:
    rows = ["| P | env | dask / matching collector, sync | async | dask / limit, sync | async | date |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for path in sorted(glob.glob(os.path.join(RESULTS, "throughput-*.json"))):
        with open(path) as f:
            r = json.load(f)
        ratios, against = r["median_ratios"], r["args"].get("against", "torchrl")
        sync, asyn = (f"{ratios[k]:.3f}" for k in ratios if "/limit" not in k)
        envs = r["args"].get("num_envs", 1)
        label = "P8" if envs > 1 else "P5" if against == "ray" else "P1"
        env = f"{r['args']['env']} × {envs} envs" if envs > 1 else r["args"]["env"]
        rows.append(
            f"| {label} | {env} ({r['args']['workers']} workers, "
            f"vs {'RayCollector' if against == 'ray' else 'Multi*Collector'}) | **{sync}** | **{asyn}** | "
            f"{ratios['dask-sync/limit']:.3f} | {ratios['dask-async/limit']:.3f} | {r['date'][:10]} |"
        )
    return rows


def tables() -> str:
    out = ["### P1, P5 and P8: throughput ratios (median of per-pair ratios)", "", *throughput_rows(), ""]
    scaling = load("scaling")
    if scaling:
        out += ["### P2: 10 ms sleep-step env, frames/s against N × one TorchRL `Collector`", "",
                "| workers | ideal | dask async | TorchRL async | dask / ideal | TorchRL / ideal |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for n, s in scaling["summary"].items():
            out.append(f"| {n} | {s['ideal_fps']:,.0f} | {s['dask-async_fps']:,.0f} | {s['torchrl-async_fps']:,.0f} "
                       f"| **{s['dask-async/ideal']:.3f}** | {s['torchrl-async/ideal']:.3f} |")  # fmt: skip
        out.append("")
    broadcast = load("broadcast")
    if broadcast:
        out += ["### P3: weight broadcast (medians)", "",
                "| size | workers | `update_policy_weights_()` until loaded | one transfer | one send per worker "
                "| update / transfer | Dask route / transfer | per-worker loop / transfer |",
                "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in broadcast["rows"]:
            dask_route = f"{r['update_dask/p2p']:.2f}" if "update_dask/p2p" in r else "–"
            out.append(f"| {r['size_mb']:g} MB | {r['workers']} | {1e3 * r['update_s']:.1f} ms | "
                       f"{1e3 * r['p2p_s']:.1f} ms | {1e3 * r['naive_s']:.1f} ms | **{r['update/p2p']:.2f}** | "
                       f"{dask_route} | {r['naive/p2p']:.2f} |")  # fmt: skip
        out.append("")
    datapath = load("datapath")
    if datapath:
        out += [f"### P4: data path, one {datapath['batch_bytes'] / 1e6:.1f} MB pixel batch, worker to driver", "",
                "| transport | ms per batch (median) |", "|---|---|"]  # fmt: skip
        out += [f"| {k} | {v['median_ms']:.0f} |" for k, v in datapath["summary"].items()] + [""]
    startup = load("startup")
    if startup:
        s, n = startup["summary"], startup["args"]["workers"]
        out += [f"### P6: start-up to the first batch, {n} workers", "",
                "| dask | MultiSyncCollector | dask / MultiSync |", "|---|---|---|",
                f"| {s['dask_s']:.2f} s | {s['torchrl_s']:.2f} s | **{s['dask/torchrl']:.2f}** |", ""]  # fmt: skip
    out += cross_host_rows()
    return "\n".join(out)


def cross_host_rows() -> list[str]:
    """The weights' fan-out across simulated hosts, at each link rate measured."""
    rows = []
    for r in weights_runs():
        rate = r["args"]["rate"]
        rows += [f"| {w['size_mb']:g} MB | {rate} | {w['hosts']} ({w['collectors']} collectors) | "
                 f"{1e3 * w['update_s']:,.0f} ms | {1e3 * w['p2p_s']:,.0f} ms | **{w['update/p2p']:.2f}** | "
                 f"{w['broadcast/p2p']:.2f} | {_ratio(w.get('replicate/p2p'))} |" for w in r["weights"]]  # fmt: skip
    if not rows:
        return []
    return ["### Across hosts: a weights update to every collector on 1–4 simulated hosts (medians)", "",
            "| size | links | hosts | update until loaded | one transfer | update / transfer "
            "| Dask's `scatter(broadcast=True)` / transfer | Dask's `replicate(branching_factor=2)` / transfer |",
            "|---|---|---|---|---|---|---|---|", *rows, ""]  # fmt: skip


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def weights_runs() -> list[dict]:
    """The newest weights run at each link rate: ``cross_host_weights_1gbit`` (weights alone) where it
    exists, else the weights part of ``cross_host``, and ``cross_host_100mbit``."""
    runs = []
    for names in (("cross_host_weights_1gbit", "cross_host"), ("cross_host_100mbit",)):
        found = [r for r in map(load, names) if r and r.get("weights")]
        runs += found[:1]
    return runs


def _figure():
    """A figure of three panels side by side (matplotlib without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 3, figsize=(16, 4.2))


def _save(fig, png: str) -> None:
    fig.tight_layout()
    os.makedirs(os.path.dirname(png), exist_ok=True)
    fig.savefig(png, dpi=100)


def plot(png: str) -> None:
    fig, (a, b, c) = _figure()
    scaling = load("scaling")
    if scaling:
        ns = sorted(int(n) for n in scaling["summary"])
        s = scaling["summary"]
        a.plot(ns, [s[str(n)]["ideal_fps"] for n in ns], "k--", marker="o", label="ideal (N × single)")
        a.plot(ns, [s[str(n)]["dask-async_fps"] for n in ns], marker="o", label="DaskCollector async")
        a.plot(ns, [s[str(n)]["torchrl-async_fps"] for n in ns], marker="o", label="MultiAsyncCollector")
        a.set(title="P2: 10 ms sleep-step env", xlabel="workers", ylabel="frames/s", xticks=ns)
        a.legend()
    labels, values = [], []
    for path in sorted(glob.glob(os.path.join(RESULTS, "throughput-*.json"))):
        with open(path) as f:
            r = json.load(f)
        against = "Ray" if r["args"].get("against") == "ray" else "TorchRL"
        for key, v in r["median_ratios"].items():
            if "/limit" not in key:
                labels.append(f"{r['args']['env'].split('-')[0]}\n{key.split('/')[0][5:]}\nvs {against}")
                values.append(v)
    b.bar(range(len(values)), values, color="tab:blue")
    b.axhline(1.0, color="k", lw=0.8, ls="--")
    b.set_xticks(range(len(labels)), labels, fontsize=7)
    b.set(title="P1 / P5: dask frames/s ÷ other collector's", ylabel="ratio")
    broadcast = load("broadcast")
    if broadcast:
        for size in sorted({r["size_mb"] for r in broadcast["rows"]}):
            rows = [r for r in broadcast["rows"] if r["size_mb"] == size]
            c.plot(
                [r["workers"] for r in rows],
                [r["update/p2p"] for r in rows],
                marker="o",
                label=f"{size:g} MB",
            )
        c.axhline(2.0, color="k", lw=0.8, ls="--")
        c.set(title="P3: update time ÷ one point-to-point transfer", xlabel="workers", ylabel="ratio")
        c.legend()
    _save(fig, png)


def plot_scale(png: str) -> None:
    """P7 and the envelope (docs/scale.md): the driver's CPU per batch, fps / ideal, batches/s."""
    fig, (a, b, c) = _figure()
    p7 = load("driver_cost")
    if p7:
        # An older run's 64 only where the latest run has none.
        s = {**(load("driver_cost_64") or {}).get("summary", {}), **p7["summary"]}
        ns = sorted(int(n) for n in s)
        for side, label in (("dask", "DaskCollector async"), ("torchrl", "MultiAsyncCollector")):
            a.plot(ns, [s[str(n)][f"{side}_driver_ms_per_batch"] for n in ns], marker="o", label=label)
            b.plot(ns, [s[str(n)][f"{side}_fps/ideal"] for n in ns], marker="o", label=label)
        if all("dask_scheduler_ms_per_batch" in s[str(n)] for n in ns):
            total = [
                s[str(n)]["dask_driver_ms_per_batch"] + s[str(n)]["dask_scheduler_ms_per_batch"] for n in ns
            ]
            a.plot(ns, total, marker="o", ls=":", label="DaskCollector: driver + its scheduler process")
        a.set(title="P7: driver CPU per batch (private cluster)", xlabel="collectors", ylabel="ms / batch",
              xticks=ns, ylim=(0, None))  # fmt: skip
        b.set(title="P7: frames/s ÷ ideal", xlabel="collectors", ylabel="ratio", xticks=ns, ylim=(0, 1.05))
        a.legend()
        b.legend()
    envelope = load("envelope")
    if envelope:
        ns = sorted(int(n) for n in envelope["summary"])
        s = envelope["summary"]
        sides = (("dask", "DaskCollector async, one host"), ("dask-hosts", "DaskCollector async, simulated hosts"),
                 ("torchrl", "MultiAsyncCollector"))  # fmt: skip
        for side, label in sides:
            if f"{side}_batches_per_s" in s[str(ns[0])]:
                c.plot(ns, [s[str(n)][f"{side}_batches_per_s"] for n in ns], marker="o", label=label)
        c.set(title="Envelope: batches/s, collectors that cost nothing", xlabel="collectors",
              ylabel="batches / s", xticks=ns, ylim=(0, None))  # fmt: skip
        c.legend()
    _save(fig, png)


def plot_cross_host(png: str) -> None:
    """The weights' fan-out against the number of hosts, at each link rate, and collection over them."""
    fig, axes = _figure()
    for ax, r in zip(axes[:2], weights_runs()):
        for size in sorted({w["size_mb"] for w in r["weights"]}):
            rows = [w for w in r["weights"] if w["size_mb"] == size]
            hosts = [w["hosts"] for w in rows]
            ax.plot(hosts, [w["update/p2p"] for w in rows], marker="o", label=f"daskcollect, {size:g} MB")
            ax.plot(hosts, [w["broadcast/p2p"] for w in rows], marker="x", ls=":",
                    label=f"Dask scatter(broadcast=True), {size:g} MB")  # fmt: skip
            if all("replicate/p2p" in w for w in rows):
                ax.plot(hosts, [w["replicate/p2p"] for w in rows], marker="+", ls="-.",
                        label=f"Dask replicate(branching_factor=2), {size:g} MB")  # fmt: skip
        ax.plot(hosts, hosts, "k--", lw=0.8, label="one send per host")
        ax.plot(hosts, [1 + math.ceil(math.log2(h)) for h in hosts], "k:", lw=0.8,
                label="binomial tree: 1 + ⌈log2 hosts⌉")  # fmt: skip
        ax.set(title=f"Weights to every collector, links {r['args']['rate']}", xlabel="hosts",
               ylabel="time ÷ one transfer", xticks=hosts, ylim=(0, None))  # fmt: skip
        ax.legend(fontsize=7)
    r = load("cross_host")
    if r and r.get("collection"):
        s = r["collection"]["summary"]
        sides = sorted(s)
        axes[2].bar(range(len(sides)), [s[k]["fps/ideal"] for k in sides], color="tab:blue")
        axes[2].set_xticks(range(len(sides)), sides, fontsize=8)
        axes[2].set(title=f"Collection over {r['collection']['collectors']} collectors on {r['args']['hosts']} hosts",
                    ylabel="frames/s ÷ ideal", ylim=(0, 1.05))  # fmt: skip
    _save(fig, png)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--doc", default=DOC, help="the Markdown file to update")
    parser.add_argument("--png", default=PNG, help="where the plot goes")
    parser.add_argument("--scale-png", default=SCALE_PNG, help="where the P7 / envelope plot goes")
    parser.add_argument("--cross-host-png", default=CROSS_HOST_PNG, help="where the cross-host plot goes")
    args = parser.parse_args()
    plot(args.png)
    plot_scale(args.scale_png)
    plot_cross_host(args.cross_host_png)
    text = tables()
    with open(args.doc) as f:
        doc = f.read()
    start, end = "<!-- report -->", "<!-- /report -->"
    doc = doc[: doc.index(start) + len(start)] + "\n" + text + "\n" + doc[doc.index(end) :]
    with open(args.doc, "w") as f:
        f.write(doc)
    print(text)


if __name__ == "__main__":
    main()
