"""Checkpoints of a collection, and a new collection that continues one.

The driver counts what it yielded; each collector actor keeps where it stood
after each rollout (:mod:`daskcollect.worker.checkpoint`). A checkpoint holds,
for each collector, the position after the last rollout the driver yielded,
so that nothing yielded is collected again and nothing unyielded is lost:
rollouts in flight, or finished but not yet yielded, are collected again by
the resumed run from the same position.

Frame accounting across a resume is exact: the resumed run yields
``total_frames`` less the frames counted in the checkpoint, and every frame's
``("collector", "collector_id")`` and ``("collector", "rollout_id")`` pair is
new. With ``restore_envs=True`` (stateless envs) each trajectory continues
where it stood, under the same trajectory id; otherwise each collector starts
new trajectories from its restored random-number generators.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from daskcollect.errors import ConfigurationError
from daskcollect.worker.checkpoint import Position, Resumed

FORMAT = "daskcollect-checkpoint-1"


class Yielded:
    """Per collector index, the actor uid and rollouts done at its last yielded rollout."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, int]] = {}

    def record(self, rollouts: list[Any]) -> None:
        """Notes the rollouts of a batch the driver is about to yield."""
        for r in rollouts:
            self.last[r.index] = (r.uid, r.rollout_id + 1)

    def start(self, index: int, uid: int, rollouts: int) -> None:
        """Notes that actor ``uid`` at ``index`` starts (resumed) with ``rollouts`` done."""
        self.last[index] = (uid, rollouts)

    def forget(self, index: int) -> None:
        """Drops collector ``index`` (it left for good)."""
        self.last.pop(index, None)

    def after(self, index: int, uid: int) -> int:
        """Rollouts done by actor ``uid`` at collector ``index``'s last yield (0: it yielded none)."""
        known = self.last.get(index)
        return known[1] if known is not None and known[0] == uid else 0


def take(engine: Any, yielded: Yielded, counters: dict[str, Any], timeout: float) -> OrderedDict:
    """The checkpoint of ``engine``'s collection (``counters``: frames, iterations, the batch options).

    Raises:
        CollectorTimeoutError: If a collector does not answer within ``timeout``.
    """
    slots = sorted(engine.pool.slots, key=lambda s: s.index)
    sync = engine.spec.batch.sync
    asks = [(s, yielded.after(s.index, s.uid)) for s in slots]
    # Sync: the collectors are idle between batches, where they stand is the position. Async: they
    # were re-armed, and each kept its position after the rollout the driver yielded last.
    calls = [(s, done, s.actor.position_now() if sync else s.actor.position(done)) for s, done in asks]
    collectors = []
    for slot, done, call in calls:
        position = call.result(timeout=timeout)
        if sync:
            now, position = position
            position = position if now == done else None
        collectors.append(
            {"index": slot.index, "incarnation": slot.uid, "rollouts": done, "position": position}
        )
    return OrderedDict(
        format=FORMAT,
        **counters,
        policy_version=engine.router.version,
        seed=engine.seed,
        run=engine.run.name if engine.run is not None else None,
        in_flight=sorted(f.slot.index for f in engine.pool.running()),
        collectors=collectors,
    )


def resume(engine: Any, yielded: Yielded, state: dict[str, Any], restore_envs: bool, timeout: float) -> None:
    """Makes ``engine``'s new collectors continue the collection checkpointed in ``state``.

    Raises:
        ConfigurationError: If ``state`` is not a checkpoint, or was taken with
            another number of collectors.
    """
    entries = state.get("collectors") or []
    slots = sorted(engine.pool.slots, key=lambda s: s.index)
    if len(entries) != len(slots):
        raise ConfigurationError(
            f"The checkpoint holds {len(entries)} collectors but this collector has {len(slots)}. "
            "Resume it with as many collectors (num_collectors=)."
        )
    # Labels taken by the checkpointed run: the resumed one (and its replacements) go past them.
    taken = [e["incarnation"] for e in entries] + [
        e["position"].namespace for e in entries if e["position"] is not None
    ]
    fresh = max(taken, default=-1) + 1
    engine.pool.reserve_uids(fresh + len(slots))
    version = int(state.get("policy_version", 0))
    # Collectors taken over from the dead driver hold the weights it sent last, newer than the
    # checkpoint's: they get the driver's policy again, as new collectors would have it.
    adopted = [s for s in slots if s.index in engine.adopted]
    reloaded = {s.index for s in adopted} if engine.reload_weights(adopted, version) else set()
    calls = []
    for i, (slot, entry) in enumerate(zip(slots, entries)):
        position: Position | None = entry["position"]
        continued = position is not None and position.continuable
        resumed = Resumed(
            namespace=position.namespace if continued else fresh + i,
            incarnation=fresh + i,
            rollouts=int(entry["rollouts"]),
            policy_version=version - 1 if slot.index in reloaded else version,
            position=position,
            restore_env=restore_envs and continued,
        )
        calls.append(slot.actor.resume(resumed))
        yielded.start(slot.index, slot.uid, resumed.rollouts)
    for call in calls:
        call.result(timeout=timeout)
    engine.router.version = version


def check(state: Any, **expected: Any) -> None:
    """Checks that ``state`` is a checkpoint taken with the ``expected`` batch options.

    Raises:
        ConfigurationError: Naming the first difference and the fix.
    """
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigurationError(
            "This is not a DaskCollector checkpoint (from state_dict()). Pass one, or a list of "
            "TorchRL state dicts, one per collector."
        )
    for key, mine in expected.items():
        if state.get(key) != mine:
            raise ConfigurationError(
                f"The checkpoint was taken with {key}={state.get(key)!r}, this collector has "
                f"{mine!r}. Resume with the same {key}."
            )


def load_torchrl_states(engine: Any, per_collector: list[dict], timeout: float) -> None:
    """Loads one TorchRL state dict into each collector, in index order (``RayCollector``'s form).

    Raises:
        ConfigurationError: If their number differs from the collectors'.
    """
    slots = sorted(engine.pool.slots, key=lambda s: s.index)
    if len(per_collector) != len(slots):
        raise ConfigurationError(
            f"The state dict holds {len(per_collector)} collectors but this collector has "
            f"{len(slots)}. Load it into a DaskCollector with as many collectors."
        )
    calls = [s.actor.load_state_dict(sd) for s, sd in zip(slots, per_collector)]
    for call in calls:
        call.result(timeout=timeout)


def check_resume(state: Any, restore_envs: bool, **expected: Any) -> None:
    """Checks ``resume_from=`` and ``restore_envs=`` before any cluster is touched.

    Raises:
        ConfigurationError: If the checkpoint does not fit, or ``restore_envs`` has none to restore.
    """
    if state is not None:
        check(state, **expected)
    elif restore_envs:
        raise ConfigurationError("restore_envs=True needs a checkpoint to restore: pass resume_from=.")


class CheckpointAPI:
    """TorchRL's ``state_dict`` / ``load_state_dict`` as a collector's methods (a mixin of
    :class:`~daskcollect.DaskCollector`, which holds ``_engine``, ``_progress``, ``spec``,
    ``settings``, ``frames_per_batch`` and ``total_frames``, and checks that it is open with
    ``_check_open``)."""

    _engine: Any
    _progress: Any
    spec: Any
    settings: Any
    frames_per_batch: int
    total_frames: int

    _check_open: Callable[[], None]  # the collector's: raises once it is closed

    def state_dict(self) -> OrderedDict:
        """A checkpoint: the driver's counters and, for each collector, where it stood after the
        last rollout yielded (:mod:`daskcollect.collection.checkpoint`).

        Save it with ``torch.save`` next to your model; :meth:`load_state_dict`
        on a new ``DaskCollector`` continues the run.
        """
        self._check_open()
        counters = {
            **self._progress.counters(),
            "frames_per_batch": self.frames_per_batch,
            "total_frames": self.total_frames,
            "sync": self.spec.batch.sync,
        }
        return take(self._engine, self._progress.yielded, counters, self.settings.timeouts.call)

    def load_state_dict(
        self, state_dict: OrderedDict | Sequence[dict], *, restore_envs: bool = False
    ) -> None:
        """Continues the collection checkpointed by :meth:`state_dict` (call it before iterating).

        Args:
            state_dict: A checkpoint, or (as for ``RayCollector``) a list of
                TorchRL state dicts, one per collector, loaded into each.
            restore_envs: Continue every trajectory where it stood, value for
                value. Only for stateless envs (whose state is their
                tensordict, as TorchRL's ``PendulumEnv``); with ``False`` each
                collector starts new trajectories from its restored
                random-number generators.

        Raises:
            ConfigurationError: If the checkpoint does not fit this collector.
        """
        self._check_open()
        timeouts = self.settings.timeouts
        if isinstance(state_dict, (list, tuple)):
            load_torchrl_states(self._engine, list(state_dict), timeouts.call)
            return
        check(state_dict, frames_per_batch=self.frames_per_batch, sync=self.spec.batch.sync)
        self._engine.pool.drain(timeouts.rollout)  # nothing collected before may be yielded
        resume(self._engine, self._progress.yielded, state_dict, restore_envs, timeouts.call)
        self._progress.restore(state_dict)
