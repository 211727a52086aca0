"""daskcollect.testing: the cluster-state check users run in their own tests, and the bound on what a long
run keeps per collector."""

from __future__ import annotations

import dask
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from makers import make_cartpole

from daskcollect import DaskCollector
from daskcollect.testing import cluster_state, differences, state_sizes


class Marker(WorkerPlugin):
    """A plugin a careless library would leave behind."""

    name = "daskcollect-test-marker"


def test_the_state_sees_what_is_left_behind_and_equal_states_have_no_differences(client):
    before = cluster_state(client, timeout=30)
    assert set(before) == {"scheduler", "workers"} and len(before["workers"]) == 2
    assert differences(before, cluster_state(client, timeout=30)) == []
    client.register_plugin(Marker())
    try:
        changed = differences(before, cluster_state(client, timeout=30))
        assert any("plugins" in line and "daskcollect-test-marker" in line for line in changed), changed
        assert len([line for line in changed if line.endswith("added ['daskcollect-test-marker']")]) == 2
    finally:
        client.unregister_worker_plugin(Marker.name)
    assert differences(before, cluster_state(client, timeout=30)) == []


def test_differences_names_each_changed_leaf():
    before = {"scheduler": {"tick": 20, "plugins": ["a", "b"]}}
    after = {"scheduler": {"tick": 10, "plugins": ["b", "a"]}}
    assert differences(before, after) == [
        "/scheduler/plugins: removed [], added [] (order)",
        "/scheduler/tick: 20 -> 10",
    ]


#: Joins and leaves, in rounds of ROUND workers at a time.
JOINS, ROUND = 100, 10


def settled(collector, batches, bound: int) -> dict[str, int]:
    """The state sizes once none is above ``bound``, collecting (bounded) until then: a rollout of a
    collector that left may be taken after it left, and what it brought goes at the next batch."""
    for _ in range(50):
        sizes = state_sizes(collector)
        if max(sizes.values()) <= bound:
            break
        next(batches)
    return sizes


def test_a_run_through_a_hundred_joins_and_leaves_keeps_its_state_flat(make_cluster):
    """The workers are Dask workers in this process (``LocalCluster(processes=False)``, over TCP): a
    hundred of them join and leave in seconds, where a hundred worker processes would take minutes."""
    cluster = make_cluster(n_workers=1, processes=False)
    fast = {"daskcollect.timeouts.retire": "20s", "daskcollect.restart-delay": "0s"}
    with Client(cluster, set_as_default=False) as client, dask.config.set(fast):
        with DaskCollector(
            make_cartpole, frames_per_batch=20, total_frames=-1, sync=True, client=client
        ) as collector:  # a client and no num_collectors: the collection follows the cluster
            batches = iter(collector)
            next(batches)
            sizes = []
            for _ in range(JOINS // ROUND):
                cluster.scale(1 + ROUND)
                client.wait_for_workers(1 + ROUND, timeout=60)
                for _ in range(200):  # bounded: a batch starts collectors on the workers that joined
                    if next(batches) is not None and collector.stats()["live_collectors"] == 1 + ROUND:
                        break
                assert collector.stats()["live_collectors"] == 1 + ROUND
                cluster.scale(1)
                for _ in range(200):  # the leavers retire gracefully, their collectors released
                    if next(batches) is not None and collector.stats()["live_collectors"] == 1:
                        break
                assert collector.stats()["live_collectors"] == 1
                sizes.append(settled(collector, batches, bound=1))
            stats = collector.stats()
    assert stats["retired"] == JOINS and stats["rollouts_lost"] == 0
    # Flat: what the one collector left needs, after every round alike, however many came and went.
    assert all(size == sizes[0] for size in sizes) and max(sizes[-1].values()) <= 1, sizes
