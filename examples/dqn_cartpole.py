"""DQN on CartPole-v1, collecting asynchronously with DaskCollector (or TorchRL's MultiAsyncCollector).

    python examples/dqn_cartpole.py                       # DaskCollector, 2 collectors, async
    python examples/dqn_cartpole.py --collector torchrl   # the same run on MultiAsyncCollector

The hyperparameters are rl-baselines3-zoo's tuned ones for CartPole-v1 (Adam
at 2.3e-3, 128 gradient steps of 64 samples per 256 frames, target network
synced after each burst, epsilon from 1 to 0.04 over 8k frames, 256x256 MLP,
Huber loss, gradients clipped at 10).

The collectors write straight into the replay buffer (``replay_buffer=``: the
iterator then yields ``None`` once per batch) and refresh their weights from
the learner's policy on their own after ``max_weight_update_interval`` batches,
so the training loop only samples and steps. The exploration epsilon is a
buffer of the policy, so it travels with the weights. Every --eval-every frames
the greedy policy plays --eval-episodes episodes on the driver; the run stops
when their mean return reaches --target (CartPole-v1 is solved at 475).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.collectors import MultiAsyncCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import ExplorationType, GymEnv, set_exploration_type
from torchrl.modules import EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate

from daskcollect import DaskCollector

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--collector", choices=["dask", "torchrl"], default="dask")
parser.add_argument("--collectors", type=int, default=2, help="collector processes (Dask workers)")
parser.add_argument("--frames", type=int, default=150_000, help="frame budget")
parser.add_argument("--frames-per-batch", type=int, default=256)
parser.add_argument("--random-frames", type=int, default=1_000, help="frames before training starts")
parser.add_argument("--eps-frames", type=int, default=8_000, help="frames over which epsilon anneals")
parser.add_argument("--eps-end", type=float, default=0.04)
parser.add_argument("--updates-per-batch", type=int, default=128, help="gradient steps per batch")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--lr", type=float, default=2.3e-3)
parser.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers")
parser.add_argument("--target-update", type=int, default=128, help="gradient steps between target syncs")
parser.add_argument("--max-grad-norm", type=float, default=10.0)
parser.add_argument("--weight-interval", type=int, default=1, help="max_weight_update_interval")
parser.add_argument("--eval-every", type=int, default=5_000)
parser.add_argument("--eval-episodes", type=int, default=5)
parser.add_argument("--target", type=float, default=475.0)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--log", default=None, help="append one JSON line per evaluation to this file")


def make_env():
    return GymEnv("CartPole-v1")


def evaluate(policy, episodes: int) -> float:
    """Mean return of greedy episodes, played on the driver."""
    env = make_env()
    total = 0.0
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            total += env.rollout(500, policy)["next", "reward"].sum().item()
    env.close()
    return total / episodes


def main(args) -> dict:
    torch.manual_seed(args.seed)
    spec = make_env().action_spec
    h = args.hidden
    net = nn.Sequential(nn.Linear(4, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 2))
    qnet = QValueActor(net, in_keys=["observation"], spec=spec)
    greedy = EGreedyModule(spec, eps_init=1.0, eps_end=args.eps_end, annealing_num_steps=args.eps_frames)
    policy = TensorDictSequential(qnet, greedy)

    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=args.batch_size)
    common = dict(
        frames_per_batch=args.frames_per_batch,
        total_frames=args.frames,
        replay_buffer=buffer,
    )
    if args.collector == "dask":
        collector = DaskCollector(
            make_env,
            policy,
            num_collectors=args.collectors,
            sync=False,
            max_weight_update_interval=args.weight_interval,
            **common,
        )
    else:
        collector = MultiAsyncCollector([make_env] * args.collectors, policy, **common)
    collector.set_seed(args.seed)

    loss_fn = DQNLoss(qnet, action_space=spec, delay_value=True, loss_function="smooth_l1")
    loss_fn.make_value_estimator(gamma=0.99)
    target_sync = HardUpdate(loss_fn, value_network_update_interval=args.target_update)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr)
    log = open(args.log, "a") if args.log else None

    frames, next_eval, start, solved_at, score, loss = 0, args.eval_every, time.monotonic(), None, 0.0, None
    for _ in collector:  # the collectors filled `buffer`; each step is one batch
        frames += args.frames_per_batch
        greedy.step(args.frames_per_batch)  # anneal epsilon (sent with the next weights)
        if frames >= args.random_frames:
            for _ in range(args.updates_per_batch):
                loss = loss_fn(buffer.sample())["loss"]
                optim.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(loss_fn.parameters(), args.max_grad_norm)
                optim.step()
                target_sync.step()
        if args.collector == "torchrl":
            collector.update_policy_weights_()  # MultiAsyncCollector has no update interval
        if frames >= next_eval:
            next_eval += args.eval_every
            score = evaluate(qnet, args.eval_episodes)
            record = {"frames": frames, "seconds": round(time.monotonic() - start, 2), "mean_return": score,
                      "eps": greedy.eps.item(), "loss": None if loss is None else loss.item()}  # fmt: skip
            print(f"frames {frames:7d}  eps {greedy.eps.item():.2f}  greedy mean return {score:6.1f}  "
                  f"loss {record['loss'] or 0:.3f}", flush=True)  # fmt: skip
            if log:
                log.write(json.dumps({**record, "collector": args.collector, "seed": args.seed}) + "\n")
            if score >= args.target:
                solved_at = frames
                break

    collector.shutdown()
    seconds = time.monotonic() - start
    if solved_at is not None:
        print(
            f"solved: greedy mean return {score:.1f} >= {args.target:g} after {solved_at} frames, {seconds:.0f}s"
        )
    else:
        print(f"not solved within {frames} frames ({seconds:.0f}s): greedy mean return {score:.1f}")
    return {"frames_to_target": solved_at, "seconds": seconds, "mean_return": score}


if __name__ == "__main__":
    main(parser.parse_args())
