"""Re-attaching: the collectors of a driver that died wait for a new driver, envs and all.

With ``daskcollect.reattach.grace-period`` set, a collection on a cluster it
did not start publishes its actors as a Dask dataset, named after the run
(:class:`RunRecord`), and keeps that record current as collectors are
replaced. A published dataset keeps its futures, so the actors outlive the
driver's ``Client``. The checkpoint names the run (``state_dict()["run"]``).

A new driver given that checkpoint (``DaskCollector(resume_from=...)``) claims
the run (:func:`claim`): if its grace period has not ended
(:class:`~daskcollect.reattach.scheduler.OrphanSweeper`), it takes the actors as they
are, with no env or policy built again, rebinds them to its own transports,
and resumes them at the checkpoint. Otherwise it builds new collectors and
resumes those.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from distributed import Client, Future

from daskcollect.errors import ConfigurationError
from daskcollect.leases.driver import Lease, lease
from daskcollect.reattach.scheduler import Held, OrphanSweeper, claim_run
from daskcollect.settings import Settings

logger = logging.getLogger(__name__)

RUN_PREFIX = "daskcollect-run-"
FORMAT = "daskcollect-run-1"


def new_run_name() -> str:
    return f"{RUN_PREFIX}{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Member:
    """One published collector: its index, actor uid, worker and actor future."""

    index: int
    uid: int
    address: str
    future: Future


@dataclass(frozen=True)
class Claimed:
    """A run taken over: its collectors, and the worker plugins its driver registered."""

    name: str
    members: tuple[Member, ...]
    plugins: tuple[str, ...]


class RunRecord:
    """The published record of one collection's actors, kept current (driver side).

    Args:
        client: The collection's ``Client``.
        name: The dataset's name.
        plugins: The worker plugins the collectors need (named in the record
            for the driver that takes it over).
        timeout: Bound on each call to the scheduler.
    """

    def __init__(self, client: Client, name: str, plugins: list[str], timeout: float):
        self.client, self.name, self.plugins, self.timeout = client, name, plugins, timeout
        self._published: tuple[int, ...] | None = None

    def publish(self, slots: list[Any]) -> None:
        """Publishes ``slots``' actors unless the record already lists exactly them."""
        uids = tuple(sorted(s.uid for s in slots))
        if uids == self._published:
            return
        record = {
            "format": FORMAT,
            "plugins": tuple(self.plugins),
            "members": [(s.index, s.uid, s.address, s.future) for s in slots],
        }
        self.client.publish_dataset(record, name=self.name, override=True, callback_timeout=self.timeout)
        self._published = uids

    def drop(self) -> None:
        """Unpublishes the record (idempotent; a scheduler gone or slow is left to its sweeper)."""
        if self._published is None:
            return
        self._published = None
        try:
            self.client.unpublish_dataset(self.name, callback_timeout=self.timeout)
        except Exception as exc:
            logger.debug("could not unpublish %s (%s)", self.name, exc)


def claim(client: Client, run: str, lease_id: str, timeout: float) -> Claimed | None:
    """Takes over ``run`` for the lease ``lease_id`` on the sweeper; ``None`` if nothing of it is left.

    Raises:
        ConfigurationError: If a driver that is still connected runs it.
    """
    status = client.run_on_scheduler(claim_run, run, lease_id, callback_timeout=timeout)
    if status == "live":
        raise ConfigurationError(
            f"The checkpoint's collection {run} is still run by a driver connected to the scheduler. "
            "Shut that driver down first, or resume from the checkpoint on another cluster."
        )
    record = client.get_dataset(run, default=None, callback_timeout=timeout) if status == "held" else None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    members = tuple(Member(*m) for m in record["members"])
    return Claimed(run, members, tuple(record["plugins"]))


def hold(
    handle: Any, settings: Settings, resumed: str | None
) -> tuple[Lease | None, RunRecord | None, Claimed | None]:
    """What a collection on a cluster it did not start holds against its driver's death.

    Args:
        handle: The collection's :class:`~daskcollect.deploy.handle.ClusterHandle`,
            its worker plugins registered.
        settings: The validated settings (the grace period).
        resumed: The run named by ``resume_from``'s checkpoint, or ``None``.

    Returns:
        The lease that has the scheduler remove what a killed driver leaves
        (``None`` on a private cluster, or where the scheduler cannot load
        daskcollect); the record of the actors, where a grace period is set
        or a run is resumed; and that run, taken over, where it is still there.

    Raises:
        ConfigurationError: If a connected driver still runs ``resumed``.
    """
    if handle.cluster is not None:
        return None, None, None
    client, timeout, grace = handle.client, settings.timeouts.call, settings.reattach_grace
    name = resumed or (new_run_name() if grace else None)
    plugins = handle.plugins  # the live list: plugins taken over join it
    held = hold_plugins(client, plugins, timeout, run=name, grace=grace)
    if held is None:
        return None, None, None
    try:
        claimed = claim(client, name, held.id, timeout) if resumed else None
    except BaseException:
        held.release()
        raise
    if claimed is not None:
        handle.adopt_plugins(list(claimed.plugins))
        held.update(Held(tuple(plugins), name, grace))
        logger.info("taking over the %d collectors of %s", len(claimed.members), name)
    return held, (RunRecord(client, name, plugins, timeout) if name else None), claimed


def hold_plugins(
    client: Any, names: list[str], timeout: float, run: str | None = None, grace: float | None = None
) -> Lease | None:
    """A lease that has the scheduler remove the worker plugins ``names`` if this driver dies, and
    the collection published as ``run`` once ``grace`` seconds have passed without a new driver.

    ``None`` where the scheduler cannot load daskcollect (logged): the plugins
    of a killed driver then stay until removed by hand.
    """
    return lease(client, OrphanSweeper(), timeout, detail=Held(tuple(names), run, grace))
