"""Background collection: ``start()`` runs the collector's batches in a thread into its replay buffer.

TorchRL 0.14's collectors collect in the background: ``start()`` returns at
once and every batch extends ``replay_buffer=``; ``pause()`` is a context
manager that stops writes once the rollouts in flight are in, and resumes on
exit. An error in the thread is kept and raised at the caller's next call on
the collector, never swallowed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from daskcollect.errors import CollectorTimeoutError, ConfigurationError

logger = logging.getLogger(__name__)


class BackgroundCollection:
    """Drains ``batches(fresh)`` in a daemon thread until it ends, :meth:`stop`, or an error.

    Args:
        batches: Makes the batches to drain (each has already extended the
            replay buffer); ``fresh`` starts a new pass, else the pass goes on.
        finish: Asks those batches to end once the rollouts in flight are in.
        name: The thread's name.
    """

    def __init__(self, batches: Callable[[bool], Iterable[object]], finish: Callable[[], None], name: str):
        self._batches, self._finish, self._name = batches, finish, name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._started = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Starts the thread (a no-op while it runs); the first start begins a new pass."""
        self.raise_error()
        if self.running:
            return
        fresh, self._started = not self._started, True
        self._thread = threading.Thread(target=self._run, args=(fresh,), name=self._name, daemon=True)
        self._thread.start()

    def _run(self, fresh: bool) -> None:
        try:
            for _ in self._batches(fresh):
                pass
        except BaseException as exc:  # kept for the caller's next call
            logger.debug("background collection ended by %r", exc)
            self._error = exc

    def stop(self, timeout: float) -> None:
        """Stops once the rollouts in flight are in (bounded by ``timeout``); idempotent."""
        thread, self._thread = self._thread, None
        if thread is None or not thread.is_alive():
            return
        self._finish()
        thread.join(timeout)
        if thread.is_alive():
            raise CollectorTimeoutError(
                f"Background collection did not stop within {timeout:g}s: a rollout is still running. "
                "Pass a longer timeout to pause(), or check the env for a stuck step().",
            )

    def raise_error(self) -> None:
        """Raises, once, the error that ended the background collection."""
        error, self._error = self._error, None
        if error is not None:
            raise error

    @contextlib.contextmanager
    def pause(self, timeout: float, resume: bool = True) -> Iterator[None]:
        """Stops writes inside the block, once the rollouts in flight are in; resumes after it."""
        was_running = self.running
        self.stop(timeout)
        self.raise_error()
        try:
            yield
        finally:
            if was_running and resume:
                self.start()


class BackgroundAPI:
    """TorchRL's background collection as a collector's methods (a mixin of
    :class:`~daskcollect.DaskCollector`, which holds ``_background``, ``replay_buffer`` and
    ``settings`` and checks that it is open with ``_check_open``)."""

    _background: BackgroundCollection
    replay_buffer: Any
    settings: Any

    _check_open: Callable[[], None]  # the collector's: raises once it is closed

    def start(self) -> None:
        """Collects in the background into ``replay_buffer=`` until ``total_frames`` or ``shutdown()``.

        Returns at once. An error in the background is raised at the next call
        on the collector.

        Raises:
            ConfigurationError: Without a replay buffer.
        """
        self._check_open()
        if self.replay_buffer is None:
            raise ConfigurationError(
                "start() collects in the background into a replay buffer: pass replay_buffer= (a "
                "torchrl.data.ReplayBuffer) to DaskCollector, or iterate over the collector instead."
            )
        self._background.start()

    @property
    def collecting_in_background(self) -> bool:
        """Whether a :meth:`start` is collecting now (``False`` once ``total_frames`` are in, or after an error)."""
        return self._background.running

    @contextlib.contextmanager
    def pause(self, timeout: float | None = None, *, resume: bool = True) -> Iterator[None]:
        """Stops background writes once the rollouts in flight are in; resumes on exit.

        Args:
            timeout: Bound on waiting for the rollouts in flight, in seconds
                (default ``daskcollect.timeouts.rollout``).
            resume: Resume the background collection when the block exits.
        """
        self._check_open()
        timeout = self.settings.timeouts.rollout if timeout is None else timeout
        with self._background.pause(timeout, resume=resume):
            yield
