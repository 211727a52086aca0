"""LLM rollouts: generated tokens per second with 1, 2 and 4 DaskLLMCollectors against TorchRL's
LLMCollector in one process, on the same model, interleaved.

    python benchmarks/llm_tokens.py --collectors 1 2 4 --pairs 3                 # CPU, the tiny model
    python benchmarks/llm_tokens.py --collectors 1 2 4 --pairs 3 --width 256 --layers 4
    python benchmarks/llm_tokens.py --collectors 1 --pairs 2 --device cuda --width 768 --layers 12   # a GPU

The model is :mod:`daskcollect.llm.testing`'s random GPT-2 (greedy, a fixed
number of new tokens per answer, so both sides generate the same tokens), the
env its ``ChatEnv`` over the repository's prompts. Each side collects
``--turns`` dialog turns after a warm-up batch; tokens/s counts the answers'
tokens (``("tokens", "response")``) over the wall time of those batches. The
DaskLLMCollector runs on a private LocalCluster with one single-threaded
worker per collector (on ``--device cuda`` each worker's model is on the GPU).
The baseline is one ``LLMCollector`` in this process with the same env batch,
at the torch threads a worker has (1) and at all of them (``--threads``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
from _common import header, save

from daskcollect.llm import DaskLLMCollector
from daskcollect.llm.testing import prompt_env, tiny_policy

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--collectors", type=int, nargs="+", default=[1, 2, 4])
parser.add_argument("--pairs", type=int, default=3)
parser.add_argument(
    "--turns", type=int, default=96, help="dialog turns timed per run (after a warm-up batch)"
)
parser.add_argument("--dialogs", type=int, default=4, help="dialogs at once in each collector's env")
parser.add_argument("--new-tokens", type=int, default=16)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--width", type=int, default=32)
parser.add_argument("--device", default="cpu")
parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="the baseline's second run")
parser.add_argument("--out", default=None)


def factory(args) -> functools.partial:
    return functools.partial(tiny_policy, new_tokens=args.new_tokens, layers=args.layers, width=args.width,
                             device=args.device)  # fmt: skip


def timed(batches, turns: int) -> float:
    """Tokens/s of the batches after the first (the warm-up), until ``turns`` turns are timed."""
    it = iter(batches)
    next(it)
    tokens, seen, start = 0, 0, time.perf_counter()
    for batch in it:
        tokens += sum(t.numel() for t in batch["tokens", "response"].reshape(-1).unbind(0))
        seen += batch.numel()
        if seen >= turns:
            break
    return tokens / (time.perf_counter() - start)


def dask_side(args, n: int) -> float:
    from distributed import Client, LocalCluster

    per = args.dialogs * 2  # a batch is every collector's dialogs, two turns each
    with LocalCluster(n_workers=n, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0") as cluster:
        with Client(cluster) as client, DaskLLMCollector(
            functools.partial(prompt_env, batch_size=args.dialogs), policy_factory=factory(args),
            dialog_turns_per_batch=per * n, total_dialog_turns=-1, num_collectors=n, client=client,
        ) as collector:  # fmt: skip
            rate = timed(collector, args.turns)
    return rate


def torchrl_side(args, threads: int) -> float:
    from torchrl.collectors.llm import LLMCollector

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        collector = LLMCollector(
            functools.partial(prompt_env, batch_size=args.dialogs), policy_factory=factory(args),
            dialog_turns_per_batch=args.dialogs * 2, total_dialog_turns=-1,
        )  # fmt: skip
        rate = timed(collector, args.turns)
        collector.shutdown()
    finally:
        torch.set_num_threads(before)
    return rate


def main(args) -> dict:
    runs: dict[str, list[float]] = {}
    for pair in range(args.pairs):
        for name, run in [("torchrl-1-thread", lambda: torchrl_side(args, 1)),
                          (f"torchrl-{args.threads}-threads", lambda: torchrl_side(args, args.threads))] + [
            (f"dask-{n}", functools.partial(dask_side, args, n)) for n in args.collectors
        ]:  # fmt: skip
            rate = run()
            runs.setdefault(name, []).append(rate)
            print(f"pair {pair}  {name:20s} {rate:9.1f} tokens/s", flush=True)
    base = statistics.median(runs["torchrl-1-thread"])
    summary = {
        name: {
            "tokens_per_s": statistics.median(v),
            "runs": v,
            "vs_torchrl_1_thread": statistics.median(v) / base,
        }
        for name, v in runs.items()
    }
    for name, s in summary.items():
        print(f"{name:20s} median {s['tokens_per_s']:9.1f} tokens/s  x{s['vs_torchrl_1_thread']:.2f}")
    model = f"gpt2-{args.layers}x{args.width}-{args.device}"
    return save(
        {**header("llm_tokens", args), "model": model, "summary": summary}, f"llm_tokens-{model}", args.out
    )


if __name__ == "__main__":
    main(parser.parse_args())
