"""What the collections on one worker change in its process, as layers over what they found (runs on workers).

Several collections may share a worker (two ``DaskCollector`` s on one
cluster, a collector and a ``DaskReplayBuffer``), and they close in any order.
Each collection's :class:`~daskcollect.worker.plugin.WorkerSetup` pushes a
:class:`Layer` here: its environment variables and event-loop tick. The
process then shows the layers over what the first one found, the latest on
top; when one goes, what it set gives way to the layers left or to what was
found; when the last goes, the process is as found. Each collector's own calls
(building its env and policy, its rollouts) run with its own collection's
variables on top (:func:`scoped_env`): sync actor methods on a worker share
one thread, so no other collection's call runs meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Layer:
    """One collection's changes.

    Attributes:
        env: Environment variables.
        tick_ms: The worker's event-loop tick in milliseconds, or ``None`` to leave it.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    tick_ms: float | None = None


class Layers:
    """This process's layers, by the token of the plugin that pushed each (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layers: dict[str, Layer] = {}
        self._found_env: dict[str, str | None] = {}  # each variable a layer set, as found
        self._found_tick: float | None = None
        self._scoped: Mapping[str, str] = {}  # the variables of the collector call running now

    def __len__(self) -> int:
        return len(self._layers)

    def push(self, token: str, layer: Layer, tick: object | None) -> None:
        """Adds ``layer`` on top and applies it (``tick``: the worker's tick callback, or ``None``)."""
        with self._lock:
            if not self._layers and tick is not None:
                self._found_tick = tick.callback_time
            for key in layer.env:
                self._found_env.setdefault(key, os.environ.get(key))
            self._layers[token] = layer
            self._apply(tick)

    def pop(self, token: str, tick: object | None) -> bool:
        """Removes the layer of ``token`` and shows what is left; ``True`` if it was the last one."""
        with self._lock:
            self._layers.pop(token, None)
            self._apply(tick)
            last = not self._layers
            if last:
                self._found_env.clear()
                self._found_tick = None
            return last

    def _value(self, key: str, otherwise: str | None) -> str | None:
        """``key``'s value by the layers: the top one that sets it, else as found (``otherwise`` if no
        layer ever set it)."""
        if key not in self._found_env:
            return otherwise
        value = self._found_env[key]
        for layer in self._layers.values():
            value = layer.env.get(key, value)
        return value

    def _apply(self, tick: object | None) -> None:
        for key in self._found_env:
            _set(key, self._scoped.get(key, self._value(key, None)))
        ticks = [layer.tick_ms for layer in self._layers.values() if layer.tick_ms is not None]
        wanted = ticks[-1] if ticks else self._found_tick
        if tick is not None and wanted is not None:
            tick.callback_time = wanted  # read at the next scheduling

    @contextlib.contextmanager
    def scoped(self, env: Mapping[str, str]) -> Iterator[None]:
        """Runs the block with ``env`` on top of the layers (a layer pushed or popped meanwhile keeps it
        there), then shows the layers again."""
        if not env:
            yield
            return
        with self._lock:
            saved = {key: os.environ.get(key) for key in env}
            self._scoped = dict(env)
            os.environ.update(env)
        try:
            yield
        finally:
            with self._lock:
                self._scoped = {}
                for key, value in saved.items():
                    _set(key, self._value(key, value))

    def sizes(self) -> dict[str, int]:
        """How many layers and found variables are held (a bound check for tests)."""
        with self._lock:
            return {"layers": len(self._layers), "found variables": len(self._found_env)}


def _set(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


#: This process's layers.
LAYERS = Layers()


def scoped_env(env: Mapping[str, str]) -> contextlib.AbstractContextManager[None]:
    """Runs a block with ``env`` set on top of the process's variables (:meth:`Layers.scoped`).

    A collector's calls run inside it, so that its env and policy code read its
    own collection's ``worker_env`` even while another collection on the same
    worker set other values. With no variables it changes nothing.
    """
    return LAYERS.scoped(env)
