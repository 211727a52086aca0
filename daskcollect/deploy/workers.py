"""Which workers the scheduler knows, and which may host a collector: bounded questions to the scheduler.

Runs on the driver.
"""

from __future__ import annotations

from collections.abc import Mapping

from distributed import Client

from daskcollect import _internals
from daskcollect.collection.polling import poll_until
from daskcollect.errors import ClusterConnectionError, NotEnoughWorkersError


def eligible_workers(client: Client, resources: Mapping[str, float] | None, timeout: float) -> list[str]:
    """Addresses of the workers that declare ``resources``, in a stable order (one bounded RPC).

    Asks the scheduler directly: ``Client.scheduler_info()`` returns a cache
    that the client's periodic refresh overwrites with a worker-less summary,
    and keeps a stale one when the RPC fails.
    """
    workers = _internals.worker_identities(client, timeout)
    out = []
    for address, info in workers.items():
        declared = info.get("resources") or {}
        if all(declared.get(k, 0) >= v for k, v in (resources or {}).items()):
            out.append(address)
    return sorted(out)


def wait_for_workers(
    client: Client, n: int, resources: Mapping[str, float] | None, timeout: float
) -> list[str]:
    """Waits until ``n`` eligible workers exist and returns their addresses.

    Raises:
        NotEnoughWorkersError: If fewer than ``n`` are there after ``timeout``.
    """
    found: list[str] = []

    def enough() -> list[str] | None:
        found[:] = eligible_workers(client, resources, timeout)
        return list(found) if len(found) >= n else None

    return poll_until(enough, timeout, fail=lambda: not_enough_workers(n, len(found), resources, timeout))


def not_enough_workers(
    needed: int, found: int, resources: Mapping[str, float] | None, timeout: float, detail: str = ""
) -> NotEnoughWorkersError:
    """The error for too few free eligible workers after ``timeout``; ``detail`` says what was seen."""
    what = f" declaring resources {dict(resources)}" if resources else ""
    seen = f" ({detail})" if detail else ""
    return NotEnoughWorkersError(
        f"Needed {needed} workers{what} (one per collector) but found {found} free after {timeout:g}s"
        f"{seen}. "
        "Start more workers, lower num_collectors, or raise daskcollect.timeouts.workers.",
        needed=needed,
        found=found,
    )


def live_workers(client: Client, timeout: float) -> set[str]:
    """The addresses of the workers the scheduler knows now (one bounded RPC).

    Raises:
        ClusterConnectionError: If the scheduler does not answer within ``timeout``.
    """
    # A client that lost its scheduler drops its rpc (client.scheduler becomes None).
    address = _internals.scheduler_address(client) or "(the client has dropped it)"
    try:
        # ncores: {address: threads}, far lighter than the scheduler's identity.
        info = client.nthreads(callback_timeout=timeout)
    except Exception as exc:
        raise ClusterConnectionError(
            f"Lost the scheduler at {address}: it did not answer within {timeout:g}s "
            f"({type(exc).__name__}: {exc}). Restart the scheduler and the collection; the workers' "
            "collectors cannot be reached without it.",
            address=address,
        ) from exc
    return set(info)
