"""Where a collector stands between rollouts, kept so that a checkpoint can continue it.

A :class:`Position` is the TorchRL collector's state less the policy's
weights (the env transforms' statistics, the trajectory-id counter), its
carrier (the tensordict the next step starts from) and the worker's
random-number generators. A checkpoint takes, for each collector, the
position after the last rollout the driver yielded; a resumed collector
restores it. In sync mode the collectors are idle between batches, so that
position is taken when the checkpoint is. In async mode a collector is
re-armed before its batch is yielded, so the actor keeps the position after
each rollout (the last :data:`KEPT`, without the generators: async mode is
not value-exact), 65 to 100 µs a rollout.

The carrier is the env's whole state only for a stateless env (TorchRL's
``PendulumEnv``, or any env whose state is in its tensordict): there a
resumed trajectory continues value for value. A stateful env (gymnasium's)
keeps its state inside the env, which no general API exports; there the
resumed collector starts new trajectories from the restored generators.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from daskcollect import _internals

#: Positions an actor keeps: enough for the rollouts that finish between a yield and a checkpoint.
KEPT = 8


@dataclass(frozen=True)
class Position:
    """Where one collector stood once some rollouts were done.

    Attributes:
        namespace: The trajectory-id namespace of the frames it made.
        collector: The TorchRL collector's ``state_dict()`` less
            ``policy_state_dict``; ``None`` for a collector whose state lives in
            its own processes (``Multi*Collector``).
        carrier: The tensordict the next step starts from, or ``None`` (as above).
        rng: The states of torch's, NumPy's and Python's generators, or
            ``None`` (async mode, which is not value-exact: not kept).
        env_rng: The state of the env's own ``torch.Generator`` (the ``rng``
            attribute of TorchRL's custom envs, such as ``PendulumEnv``), or ``None``.
    """

    namespace: int
    collector: dict[str, Any] | None
    carrier: TensorDictBase | None
    rng: tuple[torch.Tensor, Any, Any] | None
    env_rng: torch.Tensor | None = None

    @property
    def continuable(self) -> bool:
        """Whether its trajectories can go on (their ids and carrier are known)."""
        return self.collector is not None and self.carrier is not None


@dataclass(frozen=True)
class Resumed:
    """What a new actor takes over from a checkpoint.

    Attributes:
        namespace: The trajectory-id namespace to label frames with.
        incarnation: The ``("collector", "collector_id")`` label of its frames.
        rollouts: Rollouts done so far (the next rollout's id).
        policy_version: The version of the weights it starts with.
        position: Where the collector stood, or ``None``: start afresh.
        restore_env: Continue the trajectories from the carrier (stateless
            envs), rather than reset the envs.
    """

    namespace: int
    incarnation: int
    rollouts: int
    policy_version: int
    position: Position | None
    restore_env: bool


def _env_generator(collector: Any) -> torch.Generator | None:
    env = getattr(collector, "env", None)
    generator = getattr(getattr(env, "base_env", env), "rng", None)
    return generator if isinstance(generator, torch.Generator) else None


def capture(collector: Any, namespace: int, generators: bool = True) -> Position:
    """The position of ``collector`` now (copies: the collector moves on).

    Args:
        collector: The TorchRL collector.
        namespace: Its frames' trajectory-id namespace.
        generators: Keep the random-number generators' states too (what a
            value-exact resume needs; a third of the cost).
    """
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate()) if generators else None
    carrier = _internals.collector_carrier(collector)
    if carrier is None:
        return Position(namespace, None, None, rng)
    state = collector.state_dict()
    state.pop("policy_state_dict", None)  # the driver's policy is the run's; it is not saved here
    generator = _env_generator(collector) if generators else None
    env_rng = generator.get_state() if generator is not None else None
    return Position(namespace, copy.deepcopy(state), carrier.clone(), rng, env_rng)


def restore(collector: Any, position: Position | None, restore_env: bool) -> None:
    """Puts ``collector`` where ``position`` was: generators, TorchRL state and, if asked, the carrier."""
    if position is None:
        collector.reset()
        return
    if position.rng is not None:
        torch_state, numpy_state, python_state = position.rng
        torch.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    generator = _env_generator(collector)
    if generator is not None and position.env_rng is not None:
        generator.set_state(position.env_rng)
    restore_env = restore_env and position.continuable
    if position.collector is not None:
        state = dict(position.collector)
        ids = position.carrier.get(("collector", "traj_ids"), None) if restore_env else None
        if ids is not None and "traj_pool" in state:
            # TorchRL's load_state_dict draws new trajectory ids for its carrier (it cannot restore
            # an env); the carrier restored below goes on with the old ones: hand those ids back.
            state["traj_pool"] = {k: v - ids.numel() for k, v in state["traj_pool"].items()}
        collector.load_state_dict(state, strict=False)
    if restore_env:
        _internals.set_collector_carrier(collector, position.carrier.clone())
    else:
        collector.reset()
