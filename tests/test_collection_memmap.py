"""Memmap output on a shared filesystem (a temporary folder here), and the replay-buffer feed."""

from __future__ import annotations

import os
import signal
import threading
import time

import dask
import psutil
import pytest
import torch
from distributed import Client
from helpers import NO_SCHEDULER, collectors_idle, wait_until
from makers import cartpole_policy, make_cartpole, make_pixel_env
from tensordict import MemoryMappedTensor, TensorDict
from torchrl.collectors import Collector
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, ReplayBuffer

from daskcollect import (
    CollectorTimeoutError,
    ConfigurationError,
    DaskCollector,
    MemmapBatch,
    SharedFilesystemError,
)
from daskcollect.collection.memmap import TMP_PREFIX, check_writable
from daskcollect.collection.pool import ActorPool
from daskcollect.settings import Settings
from daskcollect.worker.recipe import CollectorRecipe
from daskcollect.worker.rollout import ActorSpec


def folders(root) -> list[str]:
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def collection_folder(memmap_dir) -> str:
    """The one folder a collection writes its rollouts in, under ``memmap_dir``."""
    (name,) = folders(memmap_dir)
    return os.path.join(memmap_dir, name)


def seeded(client, **kwargs):
    return DaskCollector(
        make_cartpole, cartpole_policy(0), frames_per_batch=60, total_frames=180, sync=True, seed=3,
        client=client, **kwargs,
    )  # fmt: skip


def test_handles_load_what_the_workers_collected(client, tmp_path):
    with seeded(client) as collector:
        expected = list(collector)
    with seeded(client, output="memmap", memmap_dir=tmp_path) as collector:
        root = collection_folder(tmp_path)
        for batch, want in zip(collector, expected):
            assert isinstance(batch, MemmapBatch)
            assert batch.batch_size == want.batch_size == torch.Size([2, 30])
            assert batch.collectors == (0, 1) and batch.frames == 60
            assert all(p.startswith(root) and os.path.isdir(p) for p in batch.paths)
            data = batch.load()
            leaves = [t for part in data.tensordicts for t in part.values(True, True)]
            assert all(isinstance(t, MemoryMappedTensor) for t in leaves)  # nothing read into RAM
            assert (data == want).all()
            batch.release()
            assert batch.released and not any(os.path.exists(p) for p in batch.paths)
            batch.release()  # idempotent
    assert folders(tmp_path) == []  # shutdown removes everything the collector wrote


def test_async_handles_and_keep_last_k(client, tmp_path):
    with DaskCollector(
        make_cartpole, frames_per_batch=50, total_frames=300, output="memmap", memmap_dir=tmp_path,
        memmap_retention=2, client=client,
    ) as collector:  # fmt: skip
        root = collection_folder(tmp_path)
        handles = []
        for batch in collector:
            handles.append(batch)
            assert batch.batch_size == torch.Size([50]) and len(batch.paths) == 1
            assert batch.load()["observation"].shape == torch.Size([50, 4])
            assert sum(not h.released for h in handles) <= 2
        assert [h.released for h in handles] == [True] * 4 + [False] * 2
        assert sorted(os.path.basename(p) for h in handles[-2:] for p in h.paths) == [
            f for f in folders(root) if not f.startswith(TMP_PREFIX)
        ]
    assert folders(tmp_path) == []


def test_keep_retention_survives_shutdown(client, tmp_path):
    with DaskCollector(
        make_cartpole, frames_per_batch=50, total_frames=150, output="memmap", memmap_dir=tmp_path,
        memmap_retention="keep", client=client,
    ) as collector:  # fmt: skip
        handles = list(collector)
        for h in handles:
            h.release()  # marks it released; "keep" deletes nothing
    for h in handles:
        assert TensorDict.load_memmap(h.paths[0])["observation"].shape == torch.Size([50, 4])


def test_back_pressure_holds_the_bound(client, tmp_path):
    with DaskCollector(
        make_pixel_env, frames_per_batch=20, total_frames=-1, output="memmap", memmap_dir=tmp_path,
        max_unreleased=3, client=client,
    ) as collector:  # fmt: skip
        root = collection_folder(tmp_path)
        seen_max = 0
        stop = threading.Event()

        def watch():
            nonlocal seen_max
            while not stop.is_set():
                seen_max = max(seen_max, len(folders(root)))
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        it = iter(collector)
        held = [next(it) for _ in range(3)]
        assert wait_until(lambda: collectors_idle(collector), timeout=30)  # 3 rollouts are held: nothing runs
        assert len([f for f in folders(root) if not f.startswith(TMP_PREFIX)]) == 3
        taken = []
        taker = threading.Thread(target=lambda: taken.append(next(it)))  # waits for room
        taker.start()
        assert collectors_idle(collector) and not taken
        held[0].release()
        taker.join(timeout=30)
        (fourth,) = taken
        assert held[0].released and not fourth.released
        for h in [*held[1:], fourth]:
            h.release()
        for _ in range(5):
            next(it).release()
        stop.set()
        watcher.join()
    assert seen_max <= 3


def test_back_pressure_times_out_with_a_fix(client, tmp_path):
    with dask.config.set({"daskcollect.timeouts.rollout": "2s"}):
        collector = DaskCollector(
            make_cartpole, frames_per_batch=20, total_frames=-1, output="memmap", memmap_dir=tmp_path,
            max_unreleased=2, client=client,
        )  # fmt: skip
        it = iter(collector)
        held = [next(it), next(it)]
        with pytest.raises(CollectorTimeoutError, match="release"):
            next(it)
    assert collector.closed and folders(tmp_path) == []
    assert all(not os.path.exists(p) for h in held for p in h.paths)


def test_replay_buffer_holds_exactly_the_frames_collected(client, tmp_path):
    with seeded(client) as collector:
        expected = torch.cat([b.reshape(-1) for b in collector])
    shared = tmp_path / "shared"
    shared.mkdir()
    for i, kwargs in enumerate([{}, {"output": "memmap", "memmap_dir": shared}]):
        for storage in (LazyTensorStorage(1000), LazyMemmapStorage(1000, scratch_dir=tmp_path / f"rb{i}")):
            rb = ReplayBuffer(storage=storage)
            with seeded(client, replay_buffer=rb, **kwargs) as collector:
                assert list(collector) == [None, None, None]
            assert len(rb) == 180
            stored = rb[:]
            assert (stored["observation"] == expected["observation"]).all()
            assert (stored["collector", "traj_ids"] == expected["collector", "traj_ids"]).all()
    assert folders(shared) == []


def test_list_storage_is_refused_with_memmap(tmp_path):
    with pytest.raises(ConfigurationError, match="LazyTensorStorage"):
        DaskCollector(
            make_cartpole, frames_per_batch=10, output="memmap", memmap_dir=tmp_path,
            replay_buffer=ReplayBuffer(storage=ListStorage(10)), client=NO_SCHEDULER,
        )  # fmt: skip


def test_bad_memmap_dir(tmp_path):
    with pytest.raises(ConfigurationError, match="memmap_dir"):
        DaskCollector(make_cartpole, frames_per_batch=10, output="memmap", client=NO_SCHEDULER)
    missing = tmp_path / "nope"
    with pytest.raises(SharedFilesystemError, match="the driver: memmap_dir .*nope.* does not exist"):
        DaskCollector(
            make_cartpole, frames_per_batch=10, output="memmap", memmap_dir=missing, client=NO_SCHEDULER
        )
    with pytest.raises(SharedFilesystemError, match="collector 3 on worker X"):
        check_writable(str(missing), "collector 3 on worker X")


def test_worker_that_cannot_see_the_folder_fails_before_any_rollout(client, tmp_path):
    """An actor checks its memmap folder when it starts, and names worker and path."""
    ours = Client(client.scheduler.address, set_as_default=False, direct_to_workers=True)
    pool = ActorPool(ours, Settings.load(), ActorSpec(0, 0, memmap_root=str(tmp_path / "not-on-this-worker")))
    try:
        recipe = CollectorRecipe(make_cartpole, None, None, Collector, {"frames_per_batch": 10}).dumps()
        address = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
        with pytest.raises(SharedFilesystemError) as info:
            pool.launch([(0, recipe, address)])
        assert f"collector 0 on worker {address}" in str(info.value)
        assert "not-on-this-worker" in str(info.value)
    finally:
        ours.close()


def test_worker_killed_mid_write_leaves_no_partial_batch(make_cluster, tmp_path):
    cluster = make_cluster(n_workers=2)
    with Client(cluster, set_as_default=False) as client:
        with DaskCollector(
            lambda: make_pixel_env(size=96), frames_per_batch=400, total_frames=400 * 8, output="memmap",
            memmap_dir=tmp_path, memmap_retention="keep", num_collectors=2, client=client,
        ) as collector:  # fmt: skip
            root = collection_folder(tmp_path)
            pid = client.run(os.getpid, workers=[collector.workers[0]])[collector.workers[0]]
            for i, batch in enumerate(collector):
                batch.release()
                if i == 1:  # the collectors are writing their next rollouts now
                    psutil.Process(pid).send_signal(signal.SIGKILL)
            assert collector.stats()["restarts"] >= 1  # the collection went on
    names = folders(root)
    complete = [n for n in names if not n.startswith(TMP_PREFIX)]
    assert len(complete) >= 8, names
    for name in complete:  # anything a reader could take for a batch is whole
        td = TensorDict.load_memmap(os.path.join(root, name))
        assert td.batch_size == torch.Size([400])
        assert td["pixels"].shape == torch.Size([400, 96, 96, 3])
        assert td["next", "pixels"].shape == torch.Size([400, 96, 96, 3])
