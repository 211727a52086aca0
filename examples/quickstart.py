"""Quickstart: collect CartPole rollouts on a private LocalCluster.

    python examples/quickstart.py

DaskCollector starts a loopback LocalCluster (one worker process per
collector), builds one long-lived TorchRL collector in each worker, and yields
TensorDicts exactly like TorchRL's own collectors.
"""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs import GymEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor

from daskcollect import DaskCollector


def make_env():
    return GymEnv("CartPole-v1")


if __name__ == "__main__":
    # A small stochastic policy, as in TorchRL's tutorials.
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
    policy = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )

    with DaskCollector(
        make_env,
        policy,
        frames_per_batch=500,
        total_frames=5_000,
        num_collectors=2,
        sync=True,
        track_policy_version=True,
    ) as collector:
        print("dashboard:", collector.dashboard_link)
        for i, batch in enumerate(collector):
            # batch: [num_collectors, frames_per_batch / num_collectors], last dim named "time"
            version = batch["policy_version"].max().item()
            print(f"batch {i}: shape {tuple(batch.shape)}, collected with weights v{version}")
            with torch.no_grad():  # stand-in for a training step
                for p in net.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            collector.update_policy_weights_()  # one scatter, loaded before the next rollout
