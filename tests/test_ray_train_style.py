"""A training run built the way TorchRL's ``ray_train.py`` example builds its RayCollector.

Env *instances* whose ``ObservationNorm`` statistics were set on the driver,
``collector_kwargs`` with ``max_frames_per_traj`` on an env that already has a
``StepCounter``, ``remote_configs=``, ``update_after_each_batch=True``, and a
few PPO iterations. Written for daskcollect, not copied from TorchRL.
"""

from __future__ import annotations

import warnings

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.envs import Compose, GymEnv, ObservationNorm, StepCounter, TransformedEnv
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from daskcollect import DaskCollector

OFFSET = 10.0  # added to the driver's normalisation statistics: visible in every batch


def make_env() -> TransformedEnv:
    env = TransformedEnv(
        GymEnv("Pendulum-v1"), Compose(ObservationNorm(in_keys=["observation"]), StepCounter())
    )
    env.transform[0].init_stats(num_iter=50, reduce_dim=0, cat_dim=0)
    env.transform[0].loc.add_(OFFSET)  # obs * scale + loc: every normalised observation shifts by +OFFSET
    return env


def make_modules(env):
    n_obs, n_act = env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]
    actor_net = nn.Sequential(
        nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 2 * n_act), NormalParamExtractor()
    )
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], spec=env.action_spec, distribution_class=TanhNormal,
        distribution_kwargs={"low": env.action_spec.space.low, "high": env.action_spec.space.high},
        return_log_prob=True,
    )  # fmt: skip
    value = ValueOperator(
        nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 1)), in_keys=["observation"]
    )
    return actor, value


def test_ppo_with_env_instances_and_ray_keywords(client):
    env = make_env()
    actor, value = make_modules(env)
    loss = ClipPPOLoss(actor, value)
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=value, average_gae=True)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-4)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*specific to Ray.*")
        collector = DaskCollector(
            [env] * 2, actor, frames_per_batch=500, total_frames=2000, collector_kwargs={"max_frames_per_traj": 50},
            remote_configs={"num_cpus": 1, "num_gpus": 0, "memory": 2 * 1024**3}, update_after_each_batch=True,
            sync=False, client=client,
        )  # fmt: skip
    losses, versions = [], []
    with collector:
        for batch in collector:
            # The driver's statistics arrived intact: observations are shifted by +OFFSET.
            assert batch["observation"].mean() > OFFSET / 2
            # collector_kwargs' max_frames_per_traj=50 was overridden (-1), as RayCollector does.
            assert batch["next", "step_count"].max() > 50
            with torch.no_grad():
                advantage(batch)
            for minibatch in batch.reshape(-1).split(100):
                out = loss(minibatch)
                total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optim.zero_grad()
                total.backward()
                optim.step()
                losses.append(total.item())
            versions.append(collector.policy_version)
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(losses)))
    assert versions == sorted(versions) and versions[-1] >= 3  # weights pushed after each batch
