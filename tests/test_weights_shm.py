"""Weights through the driver's shared memory: one write, read in place by workers on this host."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys

import pytest
import torch
from distributed import Client
from helpers import SHARED_MEMORY
from makers import set_constant_action
from tensordict import TensorDict
from test_weights import per_collector, probe

from daskcollect.weights.shm import SharedMemoryTransport, remove_stale


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
    shm = SharedMemoryTransport.create(str(tmp_path))
    assert shm is not None and shm.probe.matches()
    first = shm.send(weights(), 1, ["tcp://127.0.0.1:1"])
    assert first.route == "shared-memory" and first.version == 1
    read = first.ref.read(None, 1.0)
    assert (read == weights()).all() and read["n", "b"].dtype == torch.bfloat16
    assert (first.payload.weights == weights()).all()  # kept, for new actors

    # While a version is held, the next one takes another file; once it is garbage, its file is reused.
    second = shm.send(weights(2.0), 2, [])
    assert second.ref.path != first.ref.path
    path = first.ref.path
    del first, read
    gc.collect()
    third = shm.send(weights(3.0), 3, [])
    assert third.ref.path == path
    assert (third.ref.read(None, 1.0) == weights(3.0)).all()
    assert len([f for f in os.listdir(shm.path) if f.startswith("weights-")]) == 2
    # Other shapes never take a file of the ring made for these.
    other = shm.send(TensorDict(w=torch.ones(100)), 4, [])
    assert other.ref.path not in (path, second.ref.path)

    shm.close()
    shm.close()  # idempotent
    assert not os.path.exists(shm.path)
    assert shm.send(weights(), 5, []) is None  # closed: Dask takes over


def test_off_or_missing_means_dask(tmp_path):
    assert SharedMemoryTransport.create(None) is None
    assert SharedMemoryTransport.create(str(tmp_path / "missing")) is None


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


def shared_memory_of_its_own() -> str | None:
    """Why a worker cannot get a /dev/shm of its own here, or ``None`` when it can (root, unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and util-linux's unshare for a worker with a /dev/shm of its own"
    return None


@pytest.fixture
def mixed_hosts(make_cluster):
    """A worker that shares this host's /dev/shm, and one with a /dev/shm of its own (in a mount
    namespace of its own), which cannot read the driver's files, as a worker on another host."""
    reason = shared_memory_of_its_own()
    if reason:
        pytest.skip(reason)
    cluster = make_cluster(n_workers=1)
    mount = 'mount -t tmpfs tmpfs /dev/shm && exec "$@"'
    elsewhere = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", sys.executable, "-m",
         "distributed.cli.dask_worker", cluster.scheduler_address, "--host", "127.0.0.1", "--nthreads", "1",
         "--no-dashboard", "--no-nanny"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            yield client
    finally:
        elsewhere.kill()
        elsewhere.wait(timeout=30)


def test_mixed_routes_and_cleanup(mixed_hosts):
    """The collector that reads this host's shared memory gets it from there; the other gets Dask's copy."""
    policy, collector = probe(mixed_hosts, track_policy_version=True)
    with collector:
        it = iter(collector)
        assert per_collector(next(it)) == [{0}, {0}]
        (folder,) = [f for f in os.listdir(SHARED_MEMORY) if f.startswith(f"daskcollect-{os.getpid()}-")]
        set_constant_action(policy, 1)
        collector.update_policy_weights_()
        batch = next(it)
        assert per_collector(batch) == [{1}, {1}]
        assert batch["policy_version"].unique().tolist() == [1]
        routes = sorted(c["weights_route"] for c in collector.stats()["collectors"])
        assert routes == ["dask", "shared-memory"]
    assert not os.path.exists(os.path.join(SHARED_MEMORY, folder))  # shutdown removes the folder
