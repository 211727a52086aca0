"""IPPO on VMAS's "navigation" (3 agents), collecting through TorchRL's `Collector(backend="dask")`.

    python examples/ippo_vmas.py                          # 2 collectors on an embedded LocalCluster
    python examples/ippo_vmas.py --collector torchrl      # the same run on backend="process" (MultiSyncCollector)
    python examples/ippo_vmas.py --mappo                  # a centralised critic (MAPPO)
    python examples/ippo_vmas.py --log curve.jsonl        # one JSON line per iteration

TorchRL's multi-agent PPO recipe (its "Multi-Agent Reinforcement Learning (PPO)"
tutorial): each agent acts from its own observation with one shared MLP, the
critic is per agent (or centralised with --mappo), and GAE runs over the
agents' group. VMAS simulates a batch of environments at once in torch, so a
collector steps --envs-per-collector navigation tasks together.

Nothing here is specific to Dask but the backend's name: `import daskcollect`
registers `backend="dask"` with TorchRL's `Collector`, and `backend_options`
carries what a DaskCollector takes beyond TorchRL's keywords (here nothing: a
private LocalCluster with one worker per collector). Each iteration collects
one synchronous batch of [collectors, envs, steps], trains on it, and sends the
new weights once. It logs the mean return of the agents' episodes that ended
in the batch (about -0.8 for the untrained policy) and stops once it reaches
--target (2.0: the agents reach their goals), or after --iterations.
docs/training.md shows the curves.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tensordict.nn import TensorDictModule
from tensordict.nn.distributions import NormalParamExtractor
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.envs import RewardSum, TransformedEnv
from torchrl.envs.libs.vmas import VmasEnv
from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal
from torchrl.objectives import ClipPPOLoss, ValueEstimators

import daskcollect  # noqa: F401  (registers backend="dask" with TorchRL's Collector)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--collector", choices=["dask", "torchrl"], default="dask", help="torchrl: backend='process'"
)
parser.add_argument("--collectors", type=int, default=2, help="collector processes (Dask workers)")
parser.add_argument("--envs-per-collector", type=int, default=30, help="VMAS envs stepped together")
parser.add_argument("--agents", type=int, default=3)
parser.add_argument("--max-steps", type=int, default=100, help="an episode's length")
parser.add_argument("--iterations", type=int, default=20, help="at most this many batches")
parser.add_argument("--target", type=float, default=2.0, help="stop when the mean return reaches it")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--minibatch", type=int, default=400)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--mappo", action="store_true", help="a centralised critic")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--log", default=None, help="append one JSON line per iteration to this file")


def make_env_fn(args):
    def make_env():
        env = VmasEnv(
            scenario="navigation",
            num_envs=args.envs_per_collector,
            n_agents=args.agents,
            continuous_actions=True,
            max_steps=args.max_steps,
        )
        # Each agent's return is summed under ("agents", "episode_reward").
        return TransformedEnv(
            env, RewardSum(in_keys=[env.reward_key], out_keys=[("agents", "episode_reward")])
        )

    return make_env


def make_modules(env, args):
    obs = env.observation_spec["agents", "observation"].shape[-1]
    actions = env.full_action_spec_unbatched[env.action_key]

    def mlp(outputs: int, centralised: bool) -> MultiAgentMLP:
        return MultiAgentMLP(n_agent_inputs=obs, n_agent_outputs=outputs, n_agents=args.agents,
                             centralised=centralised, share_params=True, depth=2, num_cells=256,
                             activation_class=nn.Tanh)  # fmt: skip

    policy = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(mlp(2 * actions.shape[-1], centralised=False), NormalParamExtractor()),
            in_keys=[("agents", "observation")],
            out_keys=[("agents", "loc"), ("agents", "scale")],
        ),
        spec=env.action_spec_unbatched,
        in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[env.action_key],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": actions.space.low, "high": actions.space.high},
        return_log_prob=True,
    )
    critic = TensorDictModule(
        mlp(1, centralised=args.mappo),
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "state_value")],
    )
    return policy, critic


def main(args) -> dict:
    torch.manual_seed(args.seed)
    make_env = make_env_fn(args)
    env = make_env()  # the driver's copy, for the specs and the keys only
    policy, critic = make_modules(env, args)
    frames_per_batch = args.collectors * args.envs_per_collector * args.max_steps
    collector = Collector(
        make_env,
        policy,
        backend="dask" if args.collector == "dask" else "process",
        num_collectors=args.collectors,
        sync=True,
        frames_per_batch=frames_per_batch,
        total_frames=frames_per_batch * args.iterations,
    )
    collector.set_seed(args.seed)

    loss_fn = ClipPPOLoss(policy, critic, clip_epsilon=0.2, entropy_coeff=1e-4, normalize_advantage=False)
    loss_fn.set_keys(reward=env.reward_key, action=env.action_key, value=("agents", "state_value"),
                     done=("agents", "done"), terminated=("agents", "terminated"))  # fmt: skip
    loss_fn.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.9)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(frames_per_batch),
        sampler=SamplerWithoutReplacement(),
        batch_size=args.minibatch,
    )
    log = open(args.log, "a") if args.log else None
    frames, start, solved_at = 0, time.monotonic(), None

    for i, batch in enumerate(collector):
        frames += batch.numel()
        # VMAS signals "done" per env; the loss reads it per agent, like the reward.
        agent_shape = batch.get_item_shape(("next", env.reward_key))
        for key in ("done", "terminated"):
            batch.set(("next", "agents", key), batch.get(("next", key)).unsqueeze(-1).expand(agent_shape))
        with torch.no_grad():
            loss_fn.value_estimator(batch, params=loss_fn.critic_network_params,
                                    target_params=loss_fn.target_critic_network_params)  # fmt: skip
        buffer.extend(batch.reshape(-1))
        for _ in range(args.epochs):
            for _ in range(frames_per_batch // args.minibatch):
                losses = loss_fn(buffer.sample())
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                loss.backward()
                nn.utils.clip_grad_norm_(loss_fn.parameters(), 1.0)
                optim.step()
                optim.zero_grad()
        collector.update_policy_weights_()

        done = batch.get(("next", "agents", "done"))
        mean = batch.get(("next", "agents", "episode_reward"))[done].mean().item()
        record = {"iteration": i, "frames": frames, "seconds": round(time.monotonic() - start, 2),
                  "mean_return": mean, "loss": loss.item()}  # fmt: skip
        print(
            f"iter {i:3d}  frames {frames:7d}  mean return {mean:7.3f}  loss {loss.item():+.3f}", flush=True
        )
        if log:
            log.write(json.dumps({**record, "collector": args.collector, "seed": args.seed}) + "\n")
            log.flush()
        if mean >= args.target:
            solved_at = frames
            break
    collector.shutdown()
    if log:
        log.close()
    seconds = time.monotonic() - start
    if solved_at is not None:
        print(f"solved: mean return {mean:.3f} >= {args.target:g} after {solved_at} frames, {seconds:.0f}s")
    else:
        print(f"not solved within {frames} frames ({seconds:.0f}s): mean return {mean:.3f}")
    return {"frames_to_target": solved_at, "seconds": seconds, "mean_return": mean}


if __name__ == "__main__":
    main(parser.parse_args())
