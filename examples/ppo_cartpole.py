"""PPO on CartPole-v1, collecting with DaskCollector (sync) or TorchRL's MultiSyncCollector.

    python examples/ppo_cartpole.py                       # DaskCollector, 2 collectors
    python examples/ppo_cartpole.py --collector torchrl   # the same run on MultiSyncCollector
    python examples/ppo_cartpole.py --device cuda         # learner on the GPU, actors on CPU
    python examples/ppo_cartpole.py --checkpoint ckpt.pt  # resumes from ckpt.pt if it exists

TorchRL's PPO pieces (GAE, ClipPPOLoss) as in its tutorials. Each iteration
collects one synchronous batch, trains on it, and sends the new weights to the
collectors (serialized once, scattered once). It logs the mean return of the
episodes that ended in the batch and stops once the mean of the last 20
episodes reaches --target (CartPole-v1 is solved at 475).

With --checkpoint, everything the run needs to go on (the collection's
checkpoint, the networks, the optimizer, the driver's random generator, the
returns so far) replaces that file after every batch, and a run started on an
existing file continues it. --stop-after ends the run early, as a job whose
walltime ran out, so that the next one resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import deque

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import GymEnv, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from daskcollect import DaskCollector

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--collector", choices=["dask", "torchrl"], default="dask")
parser.add_argument("--collectors", type=int, default=2, help="collector processes (Dask workers)")
parser.add_argument("--frames", type=int, default=300_000, help="frame budget")
parser.add_argument("--frames-per-batch", type=int, default=2048)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--minibatch", type=int, default=256)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--target", type=float, default=475.0, help="stop when the mean return reaches it")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--device", default="cpu", help="the learner's device; collectors act on CPU")
parser.add_argument("--log", default=None, help="append one JSON line per iteration to this file")
parser.add_argument(
    "--checkpoint", default=None, help="checkpoint file: saved after each batch, resumed from"
)
parser.add_argument(
    "--stop-after", type=int, default=None, help="stop once this many frames are checkpointed"
)


def make_env():
    # RewardSum writes each episode's return under "episode_reward".
    return TransformedEnv(GymEnv("CartPole-v1"), RewardSum()).append_transform(StepCounter())


def make_modules(device: str):
    actor_net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    critic_net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    ).to(device)
    critic = ValueOperator(critic_net, in_keys=["observation"]).to(device)
    return actor, critic


def main(args) -> dict:
    if args.checkpoint and args.collector != "dask":
        parser.error("--checkpoint resumes a DaskCollector run: use it with --collector dask")
    torch.manual_seed(args.seed)
    actor, critic = make_modules(args.device)
    saved = None
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=False)
        actor.load_state_dict(saved["actor"])
        critic.load_state_dict(saved["critic"])
    # The collectors act with a CPU copy; the learner trains `actor` on args.device.
    acting_policy, _ = make_modules("cpu")
    acting_policy.load_state_dict({k: v.cpu() for k, v in actor.state_dict().items()})

    if args.collector == "dask":
        collector = DaskCollector(
            make_env,
            acting_policy,
            frames_per_batch=args.frames_per_batch,
            total_frames=args.frames,
            num_collectors=args.collectors,
            sync=True,
        )
    else:
        collector = MultiSyncCollector(
            [make_env] * args.collectors,
            acting_policy,
            frames_per_batch=args.frames_per_batch,
            total_frames=args.frames,
            cat_results="stack",
        )
    collector.set_seed(args.seed)

    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True)
    loss_fn = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr)
    returns: deque[float] = deque(maxlen=20)
    frames, start, solved_at, first = 0, time.monotonic(), None, 0
    if saved is not None:  # go on where the checkpoint left off
        collector.load_state_dict(saved["collector"])
        optim.load_state_dict(saved["optim"])
        returns.extend(saved["returns"])
        frames, first = saved["frames"], saved["iteration"]
        start -= saved["seconds"]
        torch.set_rng_state(saved["rng"])
    log = open(args.log, "a") if args.log else None

    for i, batch in enumerate(collector, start=first):
        frames += batch.numel()
        done = batch["next", "done"].squeeze(-1)
        returns.extend(batch["next", "episode_reward"][done].flatten().tolist())

        # Train: GAE over the [collectors, time] batch, then epochs of shuffled minibatches.
        batch = batch.to(args.device)
        for _ in range(args.epochs):
            with torch.no_grad():
                advantage(batch)
            flat = batch.reshape(-1)
            for idx in torch.randperm(flat.numel(), device=args.device).split(args.minibatch):
                losses = loss_fn(flat[idx])
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(loss_fn.parameters(), 0.5)
                optim.step()

        # The new weights, as CPU tensors, go to every collector (scattered once).
        acting_policy.load_state_dict({k: v.cpu() for k, v in actor.state_dict().items()})
        collector.update_policy_weights_()

        mean = sum(returns) / len(returns) if returns else float("nan")
        record = {"iteration": i, "frames": frames, "seconds": round(time.monotonic() - start, 2),
                  "mean_return": mean, "loss": loss.item()}  # fmt: skip
        print(f"iter {i:3d}  frames {frames:7d}  mean return (last 20 episodes) {mean:6.1f}  "
              f"loss {loss.item():+.3f}", flush=True)  # fmt: skip
        if log:
            log.write(json.dumps({**record, "collector": args.collector, "seed": args.seed}) + "\n")
        if len(returns) == returns.maxlen and mean >= args.target:
            solved_at = frames
            break
        if args.checkpoint:
            state = {"collector": collector.state_dict(), "actor": actor.state_dict(), "critic": critic.state_dict(),
                     "optim": optim.state_dict(), "returns": list(returns), "frames": frames, "iteration": i + 1,
                     "rng": torch.get_rng_state(), "seconds": time.monotonic() - start}  # fmt: skip
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)  # a crash mid-save keeps the last one
            if args.stop_after is not None and frames >= args.stop_after:
                print(f"stopped after {frames} frames; run again with --checkpoint to go on", flush=True)
                break

    collector.shutdown()
    seconds = time.monotonic() - start
    if solved_at is not None:
        print(f"solved: mean return {mean:.1f} >= {args.target:g} after {solved_at} frames, {seconds:.0f}s")
    else:
        print(f"not solved within {frames} frames ({seconds:.0f}s): mean return {mean:.1f}")
    return {"frames_to_target": solved_at, "seconds": seconds, "mean_return": mean}


if __name__ == "__main__":
    main(parser.parse_args())
