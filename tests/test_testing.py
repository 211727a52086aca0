"""daskcollect.testing: the cluster-state check users run in their own tests."""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin

from daskcollect.testing import cluster_state, differences


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
