"""The worker's end of a completion stream: rollout requests in, finished rollouts out, over one Dask comm.

The driver opens one comm per collector to the collector's worker, through
Dask's comm layer (so TCP, TLS or any Dask comm backend, with the cluster's
security), and sends ``{"op": "daskcollect_stream", "actor": key}``; the
worker's server hands the comm to :func:`install`'s handler, which keeps it
for the collector's life:

- Each message from the driver, ``{"weights": ref}``, is one rollout request,
  carrying the weights reference to load first (or ``None``): a credit. The driver keeps up to its
  async depth of them queued, so the collector runs rollout after rollout
  without waiting for the next request.
- Each rollout runs through Dask's own actor runner
  (:func:`daskcollect._dask.run_actor_method`), in the actor's thread, with the
  worker context that ``distributed.get_worker()`` reads, one at a time and in
  order.
- Each answer (Dask's ``{"status": ..., "result" | "exception": ...}``) is pushed
  through a ``BatchedSend`` as soon as it exists; answers that finish while one
  is being written leave together in the next write.

A comm that closes (the driver dropped the collector, closed, or died) ends the
handler: the rollout running then finishes, and nothing more starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import dask
from distributed.batched import BatchedSend
from distributed.core import Status
from distributed.protocol import to_serialize

from daskcollect import _dask

logger = logging.getLogger(__name__)

#: The worker request that turns a fresh comm into a completion stream.
OPEN = "daskcollect_stream"

#: The streams this worker serves now: actor key -> the comm's local address (its scheme says the
#: transport, ``tls://`` on a TLS cluster).
serving: dict[str, str] = {}


def sender(comm: Any) -> BatchedSend:
    """A ``BatchedSend`` on ``comm`` that writes as soon as it has messages and keeps none after.

    With no interval, what queues up during one write leaves in the next. Its
    log of recent messages would hold the last thousand rollouts' batches (each
    under 1 MB) alive: it is made empty.
    """
    with dask.config.set({"distributed.admin.low-level-log-length": 0}):
        out = BatchedSend(interval=0)
    out.start(comm)
    return out


def install(worker: Any) -> None:
    """Makes ``worker`` serve completion streams (idempotent).

    The handler is a closure over ``worker``: Dask's server wants named
    functions (no ``functools.partial``).
    """

    async def daskcollect_stream(comm: Any, actor: str) -> Any:
        requests: asyncio.Queue = asyncio.Queue()
        out = sender(comm)
        runner = asyncio.ensure_future(_run(worker, actor, requests, out))
        serving[actor] = comm.local_address
        try:
            while not runner.done():
                for request in await comm.read():
                    requests.put_nowait(request["weights"])
        except OSError:  # the driver closed the stream, or is gone
            pass
        finally:
            serving.pop(actor, None)
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
            out.abort()
        return Status.dont_reply

    _dask.add_handlers(worker, {OPEN: daskcollect_stream})


async def _run(worker: Any, actor: str, requests: asyncio.Queue, out: BatchedSend) -> None:
    """Runs the queued rollout requests one after the other and pushes each answer."""
    while True:
        weights = await requests.get()
        try:
            answer = await _dask.run_actor_method(worker, actor, "rollout", weights)
        except KeyError:  # the actor was released: the driver has dropped this collector
            return
        except Exception as exc:  # raised outside the rollout (Dask's runner): still an answer
            answer = {"status": "error", "exception": to_serialize(exc)}
        try:
            out.send(answer)
        except OSError:
            return
