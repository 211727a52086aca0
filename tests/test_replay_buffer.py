"""DaskReplayBuffer: a TorchRL replay buffer on a worker, extended by collectors worker to worker."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import torch
from distributed import Client
from makers import make_cartpole
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, SamplerWithoutReplacement

from daskcollect import ConfigurationError, DaskCollector, DaskReplayBuffer, ReplayBufferLostError


def test_learner_api_on_a_worker(client, tmp_path):
    with DaskReplayBuffer(storage=LazyTensorStorage(1000), sampler=SamplerWithoutReplacement(),
                          batch_size=32, client=client) as rb:  # fmt: skip
        assert rb.address in client.scheduler_info(n_workers=-1)["workers"]
        index = rb.extend(TensorDict(a=torch.arange(100, 200), batch_size=[100]))
        assert (index == torch.arange(100)).all() and len(rb) == 100
        sample = rb.sample()
        assert sample.batch_size == torch.Size([32]) and sample["a"].unique().numel() == 32
        checkpoint = rb.state_dict()
    with DaskReplayBuffer(storage=LazyTensorStorage(1000), batch_size=8, client=client) as restored:
        restored.load_state_dict(checkpoint)
        assert (
            len(restored) == 100 and ((restored.sample()["a"] >= 100) & (restored.sample()["a"] < 200)).all()
        )


def test_collectors_extend_it_worker_to_worker(client, tmp_path):
    storage = LazyMemmapStorage(5000, scratch_dir=str(tmp_path))  # a folder the workers see
    with DaskReplayBuffer(storage=storage, batch_size=64, client=client) as rb:
        with DaskCollector(make_cartpole, frames_per_batch=100, total_frames=1000, num_collectors=2,
                           replay_buffer=rb, client=client) as collector:  # fmt: skip
            yielded = list(collector)
            assert yielded == [None] * 10  # TorchRL's semantics: the data is in the buffer
            assert collector.stats()["frames"] == 1000
        assert len(rb) == 1000
        sample = rb.sample()
        assert sample.batch_size == torch.Size([64]) and ("next", "reward") in sample.keys(True)
        assert set(sample["collector", "collector_id"].unique().tolist()) <= {0, 1}


def test_refuses_to_run_without_a_cluster():
    with pytest.raises(ConfigurationError, match="client="):
        DaskReplayBuffer(storage=LazyTensorStorage(10))


def test_losing_its_worker_is_a_clear_error_not_a_hang(make_cluster):
    cluster = make_cluster(n_workers=2)
    with Client(cluster, set_as_default=False) as client:
        rb = DaskReplayBuffer(storage=LazyTensorStorage(100), batch_size=4, client=client)
        try:
            rb.extend(TensorDict(a=torch.arange(10), batch_size=[10]))
            pid = client.run(os.getpid, workers=[rb.address])[rb.address]
            psutil.Process(pid).send_signal(signal.SIGKILL)
            with pytest.raises(ReplayBufferLostError, match=rb.address) as info:
                for _ in range(50):  # bounded: each call is bounded by daskcollect.timeouts.call
                    rb.sample()
            assert "checkpoint" in str(info.value)
        finally:
            rb.close()
