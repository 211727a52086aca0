"""The fence, client side: Dask's ``Client`` internals and wire format that the driver uses."""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import Callable
from typing import Any

from daskcollect._internals.versions import attribute, missing


# --- client side ------------------------------------------------------------
async def cancel(client: Any, futures: list, reason: str) -> None:
    """Cancels ``futures`` from the client's event loop (``Client.cancel`` would block it)."""
    method = attribute(client, "_cancel", "Client._cancel")
    await method(futures, reason=reason)


def run_loop(main: Any) -> Any:
    """Runs the coroutine ``main`` to completion on a new event loop of the kind Dask's
    ``distributed.admin.event-loop`` names (``distributed.config.get_loop_factory``, undocumented), as
    Dask runs its own servers' loops."""
    config = importlib.import_module("distributed.config")  # the module: ``distributed.config`` is a dict
    factory = attribute(config, "get_loop_factory", "distributed.config.get_loop_factory")
    with asyncio.Runner(loop_factory=factory()) as runner:
        return runner.run(main)


def stop_loop(owner: Any) -> None:
    """Stops the event-loop thread of a synchronous ``Client`` or cluster whose close Dask skips.

    A ``Client`` that closed itself after losing its scheduler returns from
    ``close()`` at once, and a ``SpecCluster`` whose start failed raises from
    its constructor: both leave their ``IO loop`` thread running for the life of
    the process. Stopping an already-stopped loop does nothing.
    """
    runner = attribute(owner, "_loop_runner", f"{type(owner).__name__}._loop_runner")
    runner.stop()


def worker_identities(client: Any, timeout: float) -> dict[str, dict[str, Any]]:
    """Each worker's identity (``resources`` among others), asked of the scheduler now (one bounded RPC).

    ``Client.scheduler_info()`` returns a cache that the client's periodic
    refresh overwrites with a summary without workers, and has no timeout.
    """
    identity = attribute(client, "scheduler.identity", "Client.scheduler.identity")
    return client.sync(identity, n_workers=-1, callback_timeout=timeout)["workers"]


def scheduler_address(client: Any) -> str | None:
    """The address of the client's scheduler; ``None`` once the client dropped its connection."""
    return getattr(getattr(client, "scheduler", None), "address", None)


def log_event(client: Any, topic: str, msg: Any, wait: float | None) -> None:
    """Logs an event on the scheduler, as ``Client.log_event`` does; ``wait``: seconds to wait for the
    scheduler to take it, or ``None`` to send it from the client's event loop without waiting."""
    try:
        send = functools.partial(client.scheduler.log_event, topic=topic, msg=msg)
    except AttributeError as exc:
        raise missing("Client.scheduler.log_event", exc) from None
    if wait is not None:
        client.sync(send, callback_timeout=wait)
    else:
        client.loop.add_callback(send)


def rpc_message(op: str, **arguments: Any) -> dict[str, Any]:
    """The message that asks a Dask server's handler ``op`` to take over a fresh comm, with no reply."""
    return {"op": op, **arguments, "reply": False}


try:
    from distributed.core import Status as _Status

    #: What a comm handler returns when it answered on the comm itself (Dask then writes no reply).
    DONT_REPLY: Any = _Status.dont_reply
except (ImportError, AttributeError):  # pragma: no cover - checked in tests/test_internals.py
    DONT_REPLY = None


def serialized(value: Any, compression: str | None) -> Any:
    """``value`` in Dask's wire form (``distributed.protocol.Serialized``), its frames compressed with
    ``compression`` as Dask's comms would (``None``: not compressed); a comm writes it as it is."""
    try:
        from distributed.protocol import Serialized, maybe_compress, serialize
    except ImportError as exc:
        raise missing("distributed.protocol.Serialized / maybe_compress", exc) from None
    header, frames = serialize(value, on_error="raise")
    if compression:
        names, frames = (
            zip(*(maybe_compress(f, compression=compression) for f in frames)) if frames else ((), [])
        )
        header["compression"], frames = tuple(names), list(frames)
    return Serialized(header, frames)


def is_serialized(value: Any) -> bool:
    """Whether ``value`` is in Dask's wire form already (see :func:`serialized`)."""
    from distributed.protocol import Serialized

    return isinstance(value, Serialized)


def unwrap_actor_result(answer: dict[str, Any]) -> dict[str, Any]:
    """An ``actor_execute`` answer whose result is a :func:`serialized` value, with that value as its
    result: Dask's runner wraps every result for its own reply, which a completion stream does not use."""
    from distributed.protocol import Serialize

    result = answer.get("result")
    if isinstance(result, Serialize) and is_serialized(result.data):
        answer["result"] = result.data
    return answer


def actor_answer(answer: dict[str, Any]) -> tuple[bool, Any]:
    """An ``actor_execute`` answer as ``(ok, value)``: the method's result or the exception it raised,
    out of the ``Serialize`` wrapper Dask's runner puts around either for its reply."""
    from distributed.protocol import Serialize

    ok = answer.get("status") == "OK"
    value = answer.get("result" if ok else "exception")
    return ok, value.data if isinstance(value, Serialize) else value


def rpc(owner: Any, address: str) -> Any:
    """A pooled RPC to ``address`` from a ``Worker`` or a ``Client`` (``rpc(...).<handler>(...)``)."""
    pool = attribute(owner, "rpc", f"{type(owner).__name__}.rpc")
    return pool(address)


try:
    from distributed.utils import sync as _dasks_sync
except ImportError:  # looked up once, not on every call
    _dasks_sync = None


def sync(loop: Any, func: Callable, *args: Any, callback_timeout: float | None = None, **kwargs: Any) -> Any:
    """Runs the coroutine function ``func`` on the event loop ``loop`` (a Tornado ``IOLoop`` in another
    thread) and returns its result, as Dask's own ``sync`` does; asyncio's public equivalent where
    Dask's is gone."""
    if _dasks_sync is not None:
        return _dasks_sync(loop, func, *args, callback_timeout=callback_timeout, **kwargs)
    future = asyncio.run_coroutine_threadsafe(func(*args, **kwargs), loop.asyncio_loop)
    try:
        return future.result(callback_timeout)
    except TimeoutError:
        future.cancel()
        raise
