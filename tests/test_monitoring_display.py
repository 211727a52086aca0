"""The collector's notebook display (``_repr_html_``)."""

from __future__ import annotations

from makers import make_cartpole

from daskcollect import DaskCollector


def test_notebook_display(cluster, client):
    with DaskCollector(
        make_cartpole, frames_per_batch=100, total_frames=400, num_collectors=2, client=client
    ) as c:
        for _ in c:
            pass
        html = c._repr_html_()
    base = cluster.dashboard_link.rsplit("/", 1)[0]
    assert "<h3" in html and "DaskCollector" in html and "async &middot; open" in html
    assert "<strong>Collectors:</strong> 2" in html and "<strong>Frames:</strong> 400 / 400" in html
    assert f'href="{cluster.dashboard_link}"' in html and f'href="{base}/daskcollect"' in html
    assert html.count("<tr><td>") == 2  # one row per collector
    closed = c._repr_html_()
    assert "async &middot; closed" in closed and "<strong>Frames:</strong> 400" in closed
