"""Policy-version lag of async batches: driver version minus the batch's version.

A DQN-style loop: async mode, 2 collectors, the driver updates the weights
after every batch (as the DQN example does). The lag of each batch is the
driver's policy version when the batch is yielded minus the version the batch
was collected with. With the freshness rule (a rollout that starts after an
update uses it), only rollouts already running at an update lag behind.

    python benchmarks/lag.py --batches 300

Writes benchmarks/results/lag.json and prints the distribution.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import warnings

from _common import header, save
from makers import cartpole_policy, make_cartpole

from daskcollect import DaskCollector

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--frames-per-batch", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    policy = cartpole_policy()
    lags = []
    with DaskCollector(make_cartpole, policy, frames_per_batch=args.frames_per_batch, total_frames=-1,
                       num_collectors=args.workers, sync=False, track_policy_version=True) as collector:  # fmt: skip
        for i, batch in enumerate(collector):
            lags.append(collector.policy_version - int(batch["policy_version"][0]))
            collector.update_policy_weights_()
            if i + 1 >= args.batches:
                break
    counts = collections.Counter(lags[10:])  # the first batches were queued before any update
    result = {
        **header("lag", args),
        "lags": lags,
        "distribution": {str(k): v for k, v in sorted(counts.items())},
        "mean": statistics.fmean(lags[10:]),
        "max": max(lags[10:]),
    }
    path = save(result, "lag", args.out)
    print(f"lag distribution (after the first 10 batches): {dict(sorted(counts.items()))}")
    print(f"mean {result['mean']:.2f}, max {result['max']}  -> {path}")


if __name__ == "__main__":
    main()
