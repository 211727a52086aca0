"""daskcollect.collection.backend: TorchRL's front door, ``Collector(backend="dask")``.

After ``import daskcollect``, TorchRL's one entry point builds a
``DaskCollector`` for ``backend="dask"`` and inside ``torchrl.service_backend("dask")``;
every other backend is TorchRL's, untouched; TorchRL's services refuse the
``"dask"`` service backend with a typed error. In sync mode the frames equal
``backend="process"``'s, value for value, with the same seeds.
"""

from __future__ import annotations

import pytest
import torch
import torchrl
from makers import cartpole_policy, make_cartpole
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.data import ReplayBuffer
from torchrl.modules.inference_server import InferenceServer
from torchrl.testing.mocking_classes import CountingEnv

from daskcollect import ConfigurationError, DaskCollector

#: What a transition holds that does not depend on which process made it.
COMPARED = [("observation",), ("action",), ("next", "observation"), ("next", "reward"), ("next", "done")]


def test_backend_dask_builds_a_dask_collector_with_rays_keywords(client):
    collector = Collector(
        make_cartpole, cartpole_policy(), backend="dask", num_collectors=2, sync=True, frames_per_batch=100,
        total_frames=400, backend_options={"client": client},
    )  # fmt: skip
    try:
        assert type(collector) is DaskCollector and collector.num_collectors == 2
        assert [tuple(b.shape) for b in collector] == [(2, 50)] * 4
    finally:
        collector.shutdown()


def test_the_service_backend_scope_selects_dask_and_stays_out_of_what_it_builds(client):
    with torchrl.service_backend("dask"):
        collector = Collector(make_cartpole, num_collectors=2, frames_per_batch=100, total_frames=300,
                              backend_options={"client": client})  # fmt: skip
        try:
            assert (
                type(collector) is DaskCollector and not collector.spec.batch.sync
            )  # async, TorchRL's default
            assert sum(b.numel() for b in collector) == 300
        finally:
            collector.shutdown()
        with pytest.raises(
            ConfigurationError,
            match=r"ReplayBuffer cannot run on the 'dask' service backend.*DaskReplayBuffer",
        ):
            ReplayBuffer()
        with pytest.raises(ConfigurationError, match=r"InferenceServer cannot run.*inference='server'"):
            InferenceServer(cartpole_policy())
    assert isinstance(ReplayBuffer(), ReplayBuffer)  # outside the scope, TorchRL's own again


def test_every_other_backend_is_torchrls_own():
    direct = Collector(make_cartpole, frames_per_batch=10, total_frames=10)
    assert type(direct) is Collector
    direct.shutdown()
    with pytest.raises(ValueError, match="Unsupported service backend 'nope'") as caught:
        Collector(make_cartpole, backend="nope", num_collectors=2)
    assert "dask" in str(caught.value)  # TorchRL lists it among the backends
    with pytest.raises(ValueError, match="reserved selector keys"):  # TorchRL's checks, for ours too
        Collector(make_cartpole, backend="dask", num_collectors=2, backend_options={"sync": True})
    with pytest.raises(ValueError, match="duplicate top-level"):
        Collector(
            make_cartpole, backend="dask", frames_per_batch=10, backend_options={"frames_per_batch": 10}
        )


def counting_env():
    return CountingEnv(max_steps=7)


@pytest.mark.parametrize("make_env", [counting_env, make_cartpole], ids=["CountingEnv", "CartPole"])
def test_sync_frames_equal_the_process_backends_value_for_value(client, make_env):
    policy = cartpole_policy() if make_env is make_cartpole else None
    batches = {}
    for backend, options in (("process", {}), ("dask", {"client": client})):
        collector = Collector(make_env, policy, backend=backend, num_collectors=2, sync=True, frames_per_batch=60,
                              total_frames=180, backend_options=options)  # fmt: skip
        try:
            assert isinstance(collector, DaskCollector if backend == "dask" else MultiSyncCollector)
            collector.set_seed(7)
            batches[backend] = [b.clone() for b in collector]
        finally:
            collector.shutdown()
    assert len(batches["dask"]) == len(batches["process"]) == 3
    for ours, theirs in zip(batches["dask"], batches["process"]):
        assert ours.shape == theirs.shape
        for key in COMPARED:
            torch.testing.assert_close(
                ours[key], theirs[key], rtol=0, atol=0, msg=lambda m, k=key: f"{k}: {m}"
            )
