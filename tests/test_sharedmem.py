"""Weights through the driver's shared memory: one write, read in place by workers on this host."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import dask
import torch
from tensordict import TensorDict
from test_weights import per_collector, probe

from daskcollect.sharedmem import MappedFiles, SharedWeightsDir, remove_stale
from daskcollect.testing import set_constant_action
from daskcollect.weights import WeightsPayload


def weights(scale: float = 1.0) -> TensorDict:
    return TensorDict(
        {
            "a": torch.arange(5, dtype=torch.float32) * scale,
            "n": {
                "b": torch.ones(3, 2, dtype=torch.bfloat16) * scale,
                "c": torch.tensor(7, dtype=torch.int64),
            },
        },
        [],
    )


def test_write_once_read_in_place(tmp_path):
    with dask.config.set({"daskcollect.weights.shared-memory-dir": str(tmp_path)}):
        shm = SharedWeightsDir.create()
    assert shm is not None and shm.probe.matches()
    first = shm.write(WeightsPayload.from_tensordict(weights(), version=1))
    read = MappedFiles().read(first.ref()).to_tensordict()
    assert (read == weights()).all() and read["n", "b"].dtype == torch.bfloat16
    assert first.ref().key is None and first.ref().version == 1
    assert (first.result().to_tensordict() == weights()).all()  # a copy, for new actors

    # While a version is held, the next one takes another file; once it is garbage, its file is reused.
    second = shm.write(WeightsPayload.from_tensordict(weights(2.0), version=2))
    assert second.path != first.path
    path = first.path
    del first
    gc.collect()
    third = shm.write(WeightsPayload.from_tensordict(weights(3.0), version=3))
    assert third.path == path
    assert (MappedFiles().read(third.ref()).to_tensordict() == weights(3.0)).all()
    assert len([f for f in os.listdir(shm.path) if f.startswith("weights-")]) == 2

    shm.close()
    shm.close()  # idempotent
    assert not os.path.exists(shm.path)
    assert shm.write(WeightsPayload.from_tensordict(weights(), version=4)) is None  # closed: Dask takes over


def test_off_or_missing_means_dask(tmp_path):
    with dask.config.set({"daskcollect.weights.shared-memory": False}):
        assert SharedWeightsDir.create() is None
    with dask.config.set({"daskcollect.weights.shared-memory-dir": str(tmp_path / "missing")}):
        assert SharedWeightsDir.create() is None


def test_folders_of_dead_drivers_are_removed(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f"daskcollect-{int(dead.stdout)}-abcd1234"
    alive = tmp_path / f"daskcollect-{os.getppid()}-abcd1234"
    other = tmp_path / "someone-else"
    for folder in (stale, alive, other):
        folder.mkdir()
    remove_stale(str(tmp_path))
    assert not stale.exists() and alive.exists() and other.exists()


def test_mixed_routes_and_cleanup(client):
    """Collectors on this host read shared memory; one marked as on another host gets Dask's copy."""
    policy, collector = probe(client, track_policy_version=True)
    with collector:
        it = iter(collector)
        assert per_collector(next(it)) == [{0}, {0}]
        pool = collector._pool
        folder = pool._shm.path
        assert os.path.isdir(folder) and all(s.local for s in pool.slots)
        pool.slots[1].local = False  # as if its worker were on another host
        set_constant_action(policy, 1)
        collector.update_policy_weights_()
        refs = [s.pending[0] for s in pool.slots]
        assert refs[0].path is not None and refs[0].key is None
        assert refs[1].path is None and refs[1].key is not None
        batch = next(it)
        assert per_collector(batch) == [{1}, {1}]
        assert batch["policy_version"].unique().tolist() == [1]
    assert not os.path.exists(folder)  # shutdown removes the folder
