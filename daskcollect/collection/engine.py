"""The engine: one owner for the pool, the weight router, the memmap ledger and the counters.

:meth:`Engine.reconcile` is the one place where collectors are started: it
compares the collectors wanted (``num_collectors`` indices, or one per free
worker when following the cluster) with the live ones, and starts what is
missing, as ``SpecCluster._correct_state`` does for workers. Collectors whose
worker retired are counted and dropped there too. :meth:`Engine.next_rollout`
applies the one failure policy: a lost or stuck collector is dropped whole,
counted against ``max_collector_restarts`` and replaced with its latest
weights; a rollout that ended in an env error under ``on_env_error="restart"``
is dropped and counted. The iteration strategies (:mod:`daskcollect.collection.iteration`)
only decide which collector to call next.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distributed import Client

from daskcollect.collection.build import Slot
from daskcollect.collection.memmap import MemmapLedger
from daskcollect.collection.polling import poll_until
from daskcollect.collection.pool import ActorPool, CollectorLost
from daskcollect.collection.spec import CollectionSpec
from daskcollect.deploy.workers import not_enough_workers
from daskcollect.errors import ConfigurationError, NotEnoughWorkersError
from daskcollect.monitoring.stats import CollectionStats, CollectorStats, FailureCounters
from daskcollect.monitoring.telemetry import Telemetry
from daskcollect.reattach.driver import RunRecord
from daskcollect.retirement.driver import RetirementWatcher
from daskcollect.settings import Settings
from daskcollect.weights import scheme as weight_scheme
from daskcollect.weights.payload import extract_weights
from daskcollect.weights.router import WeightRouter
from daskcollect.weights.scatter import ScatterTransport
from daskcollect.weights.shm import SharedMemoryTransport
from daskcollect.worker.rollout import ActorSpec, Rollout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lost:
    """A collector's rollout that will not come: dropped whole and counted.

    Attributes:
        index: The collector.
        replacement: The collector that took its place (the same slot after an
            env rebuild), or ``None`` when the collection goes on without it.
    """

    index: int
    replacement: Slot | None


class Engine:
    """Runs one collection's collectors.

    Args:
        client: Our ``Client``.
        spec: The validated collection spec.
        settings: The validated ``daskcollect`` settings.
        num_collectors: How many collectors to start.
        recipes: One cloudpickled recipe per collector index.
        weights_source: The driver's policy module: updates must fit its
            weights, and ``update_after_each_batch`` /
            ``max_weight_update_interval`` refresh only where there is one.
        push: How those refreshes are sent (the collector's
            ``update_policy_weights_``, through its scheme or updater);
            default: straight to the router.
        run: The published record of the collectors, for a driver that
            re-attaches (:mod:`daskcollect.reattach.driver`); ``None``: none.
        pool: Built here by default; given by tests that drive the engine
            against a small fake pool.
        router: As ``pool``.
        watcher: As ``pool``.
    """

    def __init__(
        self,
        client: Client,
        spec: CollectionSpec,
        settings: Settings,
        num_collectors: int,
        recipes: list[bytes],
        weights_source: Any = None,
        *,
        push: Callable[[list[Slot]], None] | None = None,
        run: RunRecord | None = None,
        pool: ActorPool | None = None,
        router: WeightRouter | None = None,
        watcher: RetirementWatcher | None = None,
    ):
        self.client, self.spec, self.settings = client, spec, settings
        self.requested = num_collectors
        self.run = run
        self.servers: Any = None  # central inference's servers: they alone get the weights
        #: The indices of the collectors taken over from a driver that died (:meth:`adopt`).
        self.adopted: tuple[int, ...] = ()
        self.failures = FailureCounters()
        self.telemetry = Telemetry(settings.episode_window)
        self._recipes = dict(enumerate(recipes))
        self._next_index = len(recipes)  # following the cluster, a joining worker's collector takes the next
        #: Called with the index of a collector that left for good (following the cluster): what is kept
        #: per collector elsewhere goes with it.
        self.on_forget: list[Callable[[int], None]] = []
        #: Turns a wait for workers that failed into the error to raise: the session names the batch
        #: jobs that keep workers away (:class:`~daskcollect.deploy.jobs.BatchJobs`).
        self.explain: Callable[[NotEnoughWorkersError], NotEnoughWorkersError] = lambda error: error
        self._weights_source = weights_source
        self._push = push or (lambda slots: self.send_weights(weights_source, slots))
        self._known_workers: set[str] = set()
        self._events: Any = None  # the scheduler's worker events (watch())
        self._seed: int | None = None
        out = spec.output
        self.ledger = (
            MemmapLedger(out.memmap_dir, out.memmap_retention, out.max_unreleased) if out.memmap else None
        )
        if router is None:
            shm = SharedMemoryTransport.create(settings.shared_memory_dir)
            reference = extract_weights(weights_source) if weights_source is not None else None
            router = WeightRouter(ScatterTransport(client, settings.timeouts.weights), shm, reference)
        self.router = router
        template = ActorSpec(
            index=0,
            uid=0,
            # With central inference the servers write the version of the weights that acted.
            track_policy_version=spec.weights.track_policy_version and spec.inference is None,
            memmap_root=self.ledger.root if self.ledger else None,
            restart_env_on_error=spec.faults.on_env_error == "restart",
            shared_memory=router.probe,
            weights_timeout=settings.timeouts.weights,
            gc_freeze=settings.worker.gc_freeze,
            replay_buffer=getattr(spec.output.replay_buffer, "actor", None),
            trace_frames=spec.output.trace_frames,
            keep_positions=not spec.batch.sync,
            weight_receiver=weight_scheme.receiver(spec.weights.updater, spec.weights.schemes),
            worker_env=dict(spec.cluster.worker_env),
        )
        self.pool = pool or ActorPool(client, settings, template, spec.cluster.worker_resources)
        self.watcher = watcher or RetirementWatcher(client, self.pool, settings.timeouts.call)

    def watch(self, events: Any) -> None:
        """Learns of workers that join and leave from ``events``
        (:class:`~daskcollect.membership.driver.ClusterEvents`), instead of asking the scheduler."""
        self._events = events
        self.pool.watch(events)

    def _wait(self, check: Callable[[], Any], timeout: float, fail: Callable[[], BaseException]) -> Any:
        """Calls ``check`` now and whenever a worker joins or leaves until it is truthy (bounded)."""
        if self._events is not None:
            return self._events.wait_until(check, timeout, fail=fail)
        return poll_until(check, timeout, interval=0.2, fail=fail)

    # --- collectors wanted against collectors live -----------------------------
    def start(self) -> None:
        """Starts ``num_collectors`` collectors, waiting (bounded) for enough free eligible workers.

        Raises:
            NotEnoughWorkersError: If too few eligible workers join in time.
        """
        self._start(list(range(self.requested)), wait=True)
        self._publish_run()

    def adopt(self, members: list[Any]) -> None:
        """Takes over the collectors of a driver that died, and starts the ones missing.

        Args:
            members: :class:`~daskcollect.reattach.driver.Member` records of a claimed run.

        Raises:
            NotEnoughWorkersError: If too few eligible workers are free for the missing ones.
        """
        wanted = [m for m in members if m.index < self.requested]
        slots = self.pool.adopt(wanted, self._recipes)
        self.pool.add(slots)
        self.watcher.adopt(slots)
        self.adopted = tuple(s.index for s in slots)
        missing = sorted(set(range(self.requested)) - set(self.adopted))
        if missing:
            logger.info("collectors %s of the run were gone; starting them again", missing)
            self._start(missing, wait=True)
        self._publish_run()

    def _publish_run(self) -> None:
        if self.run is not None:
            self.run.publish(self.pool.slots)

    def reconcile(self, wait_retired: bool = False) -> None:
        """Drops retired collectors and starts the missing ones on free workers.

        Args:
            wait_retired: Wait (bounded) for retiring collectors with no call
                running to be released first (sync mode: no batch is half-made).

        Raises:
            NotEnoughWorkersError: If no collector is left and none can be
                started within ``daskcollect.timeouts.workers``.
        """
        gone = self.watcher.take_retired(wait_retired)
        if gone:
            self.failures.retired += len(gone)
            logger.info("collectors %s closed: their workers retired", [s.index for s in gone])
        self._forget_gone()
        self._start_missing(look_again=False)
        if self.pool.slots:
            self._publish_run()
            return
        timeout = self.settings.timeouts.workers
        self._wait(
            lambda: self._start_missing(look_again=True) or self.pool.slots,
            timeout,
            fail=lambda: self.explain(
                NotEnoughWorkersError(
                    f"Every collector's worker left and no eligible worker joined within {timeout:g}s. "
                    "Add workers, or raise daskcollect.timeouts.workers.",
                    needed=1,
                    found=0,
                )
            ),
        )
        self._publish_run()

    def _forget_gone(self) -> None:
        """Following the cluster, drops what is kept for the collectors that left: a joining worker's
        collector takes a new index, so theirs never come back."""
        if not self.spec.follow:
            return  # the same indices are started again: what is kept for them is bounded by their number
        # A rollout of a collector that left may still be consumed after it left, and be counted
        # again: what is kept for it goes at the next look (one look a batch; sets of a few ints).
        if len(self._recipes) <= 1 and self.telemetry.size() <= self.pool.num_slots:
            return  # the usual case: nothing to forget
        live = {s.index for s in self.pool.slots}
        kept = set(self._recipes) | self.telemetry.indices() | self.router.indices()
        for index in kept - live:
            if index != 0:  # the recipe that joining workers' collectors are built from
                self._recipes.pop(index, None)
            self.router.forget(index)
            self.telemetry.forget(index)
            for forget in self.on_forget:
                forget(index)

    def sizes(self) -> dict[str, int]:
        """How many entries each per-collector structure holds (a bound check for tests)."""
        pool = self.pool.sizes()
        return {
            "recipes": len(self._recipes),
            "telemetry": self.telemetry.size(),
            **self.router.sizes(),
            **pool,
        }

    def _start_missing(self, look_again: bool) -> list[Slot]:
        """Starts collectors on free workers: every one that joined when following the
        cluster, otherwise those that bring the count back to ``num_collectors``."""
        if self.spec.follow:
            if not look_again and self._events is not None and not self._events.maybe_joined():
                return []  # no worker joined: no RPC this batch
            alive = self.pool.live_workers()
            if alive <= self._known_workers and not look_again:
                return []
            self._known_workers = alive
            free = self.pool.free_workers()
            indices = list(range(self._next_index, self._next_index + len(free)))
        else:
            if self.pool.num_slots >= self.requested:
                return []  # the usual case, checked once per batch
            live = {s.index for s in self.pool.slots}
            indices = sorted(set(range(self.requested)) - live)
            if not indices:
                return []
            free = self.pool.free_workers()
        new = self._start(indices[: len(free)], free, wait=False) if free else []
        self._next_index = max([self._next_index, *(s.index + 1 for s in new)])
        if new:
            logger.info("started collectors %s on joining workers", [s.index for s in new])
        return new

    def _start(
        self, indices: list[int], addresses: list[str] | None = None, *, wait: bool, seed: int | None = None
    ) -> list[Slot]:
        """Starts collectors ``indices`` on ``addresses`` (default: free workers).

        With ``wait``, a collector whose worker left during its start is
        started again on a free worker, and free workers are waited for,
        within ``daskcollect.timeouts.workers``.

        Raises:
            NotEnoughWorkersError: If, with ``wait``, no free worker takes over in time.
        """
        deadline = time.monotonic() + self.settings.timeouts.workers
        started: list[Slot] = []
        while indices:
            if addresses is None:
                addresses = self._free_workers(len(indices), deadline) if wait else []
            todo = [(i, self._recipes.get(i, self._recipes[0]), a) for i, a in zip(indices, addresses)]
            slots, lost = self.pool.launch(todo, seed)
            for slot in slots:
                self._recipes.setdefault(slot.index, slot.recipe)
                self.router.adopt(slot)
            self.pool.add(slots)
            self.watcher.adopt(slots)
            started += slots
            if not wait:
                break
            if lost:
                logger.info("collectors %s lost their workers while starting; starting them elsewhere", lost)
            indices, addresses = lost + indices[len(todo) :], None
        return started

    def _free_workers(self, n: int, deadline: float) -> list[str]:
        """``n`` free eligible workers, waited for until ``deadline``."""
        found: list[str] = []
        resources = self.spec.cluster.worker_resources

        def enough() -> bool:
            found[:] = self.pool.free_workers()
            return len(found) >= n

        self._wait(
            enough,
            max(deadline - time.monotonic(), 0.0),
            fail=lambda: self.explain(
                not_enough_workers(n, len(found), resources, self.settings.timeouts.workers, self.pool.census)
            ),
        )
        return found[:n]

    # --- rollouts and the failure policy -----------------------------------
    def submit(self, slot: Slot) -> bool:
        """Starts a rollout on ``slot`` with the weights it has not loaded yet; ``False`` if retiring."""
        return self.pool.submit(slot, self.router.pending(slot.index), self.router.sent_version(slot.index))

    def next_rollout(self) -> Rollout | Lost:
        """The next finished rollout, or what was lost instead (counted, and replaced when possible).

        Raises:
            RolloutError: If a rollout raised on its worker (``on_env_error="raise"``).
            CollectorLostError: Once restarts exceed ``max_collector_restarts``.
            NotEnoughWorkersError: If no worker can host a replacement in time.
        """
        try:
            slot, rollout = self.pool.next_completion(self.settings.timeouts.rollout)
        except CollectorLost as lost:
            return Lost(lost.slot.index, self._replace(lost))
        if rollout.error is not None:
            self.failures.env_restarts += 1
            self.failures.lost(
                1,
                self._frames_each(),
                f"collector {rollout.index}: env error, collector rebuilt:\n{rollout.error}",
            )
            logger.warning("collector %d: env error, rebuilt the collector", rollout.index)
            self.failures.check_budget(self.spec.faults.max_collector_restarts)
            return Lost(rollout.index, self.pool.slot(rollout.index))
        self.router.loaded(slot.index, rollout.policy_version)
        self.telemetry.record(rollout, self.router.version - rollout.policy_version)
        return rollout

    def _frames_each(self) -> int:
        return self.spec.batch.frames_per_collector(max(len(self.pool.slots), 1))

    def _replace(self, lost: CollectorLost) -> Slot | None:
        """Drops a lost collector's calls whole and starts a replacement with its latest weights."""
        slot = lost.slot
        self.pool.live_workers()  # a lost scheduler is a ClusterConnectionError, not a restart
        dropped = self.pool.remove(slot) + lost.calls
        cause = f"collector {slot.index} on {slot.address}: {lost.cause}"
        self.failures.lost(dropped, self._frames_each(), cause)
        logger.warning("collector %d lost (%s)", slot.index, lost.cause)
        if lost.hung:
            # A stuck actor thread blocks every later actor call on that worker: restart it.
            with contextlib.suppress(Exception):
                self.client.restart_workers([slot.address], timeout=self.settings.timeouts.shutdown)
        if self.spec.follow and not self.pool.free_workers():
            # Following the cluster, which shrank (scale-down, adapt): go on with fewer
            # collectors; a worker that joins later gets one again.
            logger.warning("collector %d dropped: its worker left and none is free", slot.index)
            self._forget_gone()
            return None
        self.failures.restarts += 1
        self.failures.check_budget(self.spec.faults.max_collector_restarts)
        time.sleep(self.settings.restart_delay)
        seed = None if self._seed is None else self._seed + 7919 * self.failures.restarts
        (new,) = self._start([slot.index], wait=True, seed=seed)
        self._publish_run()
        return new

    def wait_for_room(self, needed: int) -> None:
        """Back-pressure of memmap output: no rollout starts beyond ``max_unreleased``."""
        if self.ledger is not None:
            self.ledger.wait_for_room(needed, self.pool.num_inflight, self.settings.timeouts.rollout)

    # --- weights -----------------------------------------------------------
    def select(self, worker_ids: int | Sequence[int] | None) -> list[Slot]:
        """The live collectors named by ``worker_ids`` (all of them for ``None``)."""
        by_index = {s.index: s for s in self.pool.slots}
        if worker_ids is None:
            return list(by_index.values())
        ids = [worker_ids] if isinstance(worker_ids, int) else list(worker_ids)
        bad = [i for i in ids if i not in by_index]
        if bad:
            raise ConfigurationError(
                f"worker_ids {bad} are not collector indices; valid ones are {sorted(by_index)}."
            )
        return [by_index[i] for i in ids]

    def serve_from(self, servers: Any) -> None:
        """Central inference: weights go to ``servers`` (``InferenceServers``), the collectors hold none."""
        self.servers = servers
        if servers is not None:
            self.pool.reserved = servers.reserved  # one set: a replaced server's new worker is reserved too
            servers.hosting = lambda: {slot.address for slot in self.pool.slots}

    def send_weights(self, source: Any, slots: list[Slot]) -> int:
        """Publishes the weights of ``source`` to ``slots`` as a new version; returns the version.

        Collectors with calls in flight are told at once, so that every rollout
        starting after this returns uses the new weights; idle ones get them
        with their next call.

        Raises:
            ConfigurationError: If the weights' keys, shapes or dtypes differ
                from the policy's.
        """
        if self.servers is not None:
            self.servers.load_weights(extract_weights(source))
            self.router.version += 1
            return self.router.version
        version = self.router.publish(extract_weights(source), slots)
        offers = [(s, self.router.pending(s.index)) for s in slots if self.pool.inflight_count(s)]
        self.pool.offer([(s, sent) for s, sent in offers if sent is not None])
        return version

    def reload_weights(self, slots: list[Slot], version: int) -> bool:
        """Sends the driver policy's weights to ``slots`` as ``version``, for collectors taken
        over with another driver's weights; ``False`` (nothing sent) without a policy module."""
        if self._weights_source is None or not slots:
            return False
        self.router.version = version - 1
        self.send_weights(self._weights_source, slots)
        return True

    def refresh(self, slots: list[Slot]) -> None:
        """Applies ``update_after_each_batch`` / ``max_weight_update_interval`` to ``slots``."""
        options, source = self.spec.weights, self._weights_source
        if source is None or not slots:
            return
        if options.update_after_each_batch:
            stale = slots
        elif options.max_weight_update_interval > -1:
            indices = self.router.stale([s.index for s in slots], options.max_weight_update_interval)
            stale = [s for s in slots if s.index in indices]
        else:
            return
        if stale:
            self._push(stale)

    # --- seeds, stats, close --------------------------------------------------
    @property
    def seed(self) -> int | None:
        """The seed of the last :meth:`set_seed`, or ``None``."""
        return self._seed

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the collectors in order (``MultiSyncCollector``'s chain), then resets their envs."""
        self._seed = seed
        if self.pool.num_inflight:
            self.pool.drain(self.settings.timeouts.rollout)  # no rollout may straddle the reseed
        for slot in self.pool.slots:
            seed = self.pool.call(slot, "set_seed", seed, static_seed)
        self.pool.call_all("reset")
        return seed

    def stats(self) -> CollectionStats:
        slots = self.pool.slots
        busy = {f.slot.index for f in self.pool.running()}
        return CollectionStats(
            failures=self.failures,
            live_collectors=len(slots),
            telemetry=self.telemetry.collection([s.index for s in slots]),
            collectors=tuple(
                CollectorStats(
                    index=s.index,
                    worker=s.address,
                    collector_id=s.uid,
                    state="retiring" if s.retiring else "collecting" if s.index in busy else "idle",
                    rollouts=s.rollouts,
                    frames=s.frames,
                    fps=s.frames / s.seconds if s.seconds else 0.0,
                    policy_version=s.policy_version,
                    weights_route=self.router.route(s.index),
                    **self.telemetry.collector(s.index),
                )
                for s in slots
            ),
        )

    def close(self, timeout: float) -> None:
        """Closes the actors, the weights' transports and the ledger (bounded, idempotent enough)."""
        self.watcher.close()
        if self.run is not None:
            self.run.drop()
        self.pool.close(timeout)
        self.router.close(timeout / 4)
        if self.ledger is not None:
            self.ledger.close()
