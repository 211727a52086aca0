"""Multi-agent collection: TorchRL's multi-agent, heterogeneous and nested mock envs, both modes.

TorchRL's ``torchrl.testing`` envs are the spec: ``MultiAgentCountingEnv``
(agents under one group key), ``HeterogeneousCountingEnv`` (agents whose
observations differ in shape: a lazy stack), ``NestedCountingEnv`` (nested
done and reward keys). Sync mode with collectors whose batches differ in shape
(different agent counts) gives a lazily stacked batch, as TorchRL's own lazy
stacks do, where ``RayCollector``'s ``torch.stack`` fails. And two real
multi-agent libraries through TorchRL's wrappers: VMAS and PettingZoo's MPE.
"""

from __future__ import annotations

import functools

import pytest
import torch
from makers import make_mpe_spread, make_vmas_balance
from tensordict import LazyStackedTensorDict
from torchrl.collectors import MultiSyncCollector
from torchrl.testing.mocking_classes import HeterogeneousCountingEnv, MultiAgentCountingEnv, NestedCountingEnv

from daskcollect import DaskCollector

ENVS = {
    "multi-agent": functools.partial(MultiAgentCountingEnv, n_agents=3),
    "heterogeneous": HeterogeneousCountingEnv,
    "nested": functools.partial(NestedCountingEnv, nest_obs_action=True, nest_done=True, nest_reward=True),
}


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("name", list(ENVS))
def test_torchrls_multi_agent_envs_collect(client, name, sync):
    make_env = ENVS[name]
    with DaskCollector(
        [make_env] * 2, frames_per_batch=40, total_frames=120, sync=sync, client=client
    ) as collector:
        batches = list(collector)
    reference = make_env().rollout(3)
    assert sum(b.numel() for b in batches) == 120
    for batch in batches:
        # Every key TorchRL's own rollout has, at the same depth.
        assert set(reference.keys(True, True)) <= set(batch.keys(True, True)), name
        assert tuple(batch.batch_size) == ((2, 20) if sync else (40,))


def agents(n: int):
    return MultiAgentCountingEnv(n_agents=n)


def test_collectors_with_different_agent_counts_give_a_lazy_stack_in_sync_mode(client):
    makers = [functools.partial(agents, 2), functools.partial(agents, 3)]
    with DaskCollector(makers, frames_per_batch=40, total_frames=80, sync=True, client=client) as collector:
        batches = list(collector)
    assert len(batches) == 2
    for batch in batches:
        assert batch.batch_size == torch.Size([2, 20])
        # The part that differs is a lazy stack; what both share stays dense.
        assert isinstance(batch["agents"], LazyStackedTensorDict) and batch["agents"].stack_dim == 0
        assert set(batch[0]["agents"].keys()) == {"agent_0", "agent_1"}
        assert set(batch[1]["agents"].keys()) == {"agent_0", "agent_1", "agent_2"}
        assert batch["env_done"].shape == (2, 20, 1) and not isinstance(batch, LazyStackedTensorDict)
        counts = batch[1]["agents", "agent_2", "observation"]  # the third agent's own frames
        assert counts.shape[0] == 20


def test_sync_multi_agent_frames_equal_multisynccollectors(client):
    makers = [functools.partial(agents, 2)] * 2
    ours = DaskCollector(makers, frames_per_batch=40, total_frames=80, sync=True, client=client)
    theirs = MultiSyncCollector(makers, frames_per_batch=40, total_frames=80, cat_results="stack")
    try:
        ours.set_seed(3)
        theirs.set_seed(3)
        for a, b in zip(ours, theirs):
            keys = [
                ("agents", "agent_0", "observation"),
                ("agents", "agent_1", "action"),
                ("next", "agents", "agent_1", "reward"),
            ]
            for key in keys:
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    finally:
        ours.shutdown()
        theirs.shutdown()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("make_env", [make_vmas_balance, make_mpe_spread], ids=["vmas", "pettingzoo-mpe"])
def test_vmas_and_pettingzoo_envs_collect(client, make_env, sync):
    reference = make_env().rollout(2)
    frames = 80 if make_env is make_vmas_balance else 40  # VMAS steps 4 envs at once
    with DaskCollector([make_env] * 2, frames_per_batch=frames, total_frames=3 * frames, sync=sync,
                       client=client) as collector:  # fmt: skip
        batches = list(collector)
        stats = collector.stats()
    assert sum(b.numel() for b in batches) == 3 * frames and stats["rollouts_lost"] == 0
    group = "agents" if make_env is make_vmas_balance else "agent"
    for batch in batches:
        assert set(reference.keys(True, True)) <= set(batch.keys(True, True))
        assert (
            batch[group, "observation"].shape[-2] == reference[group, "observation"].shape[-2]
        )  # the agents
