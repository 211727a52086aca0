"""TorchRL's weight-sync keywords on Dask: daskcollect's route as a ``WeightSyncScheme`` and as an updater.

``DaskCollector`` takes ``weight_sync_schemes=`` and ``weight_updater=`` as
``RayCollector`` does:

- :class:`DaskWeightSyncScheme` is the default for ``"policy"``, as
  ``RayWeightSyncScheme`` is Ray's. On the driver, :meth:`~DaskWeightSyncScheme.send`
  publishes through the collection's weight router (one shared-memory write
  for the driver's host, one Dask scatter for the others). On each worker, a
  copy is registered on the TorchRL collector with ``register_scheme_receiver``,
  and the collector's ``receive_weights()`` takes the weights a rollout call
  brought and cascades them as TorchRL does (to the processes of an inner
  ``Multi*Collector`` too).
- TorchRL's ``NoWeightSyncScheme`` turns updates off.
- ``RayWeightSyncScheme`` (code written for Ray) becomes a
  :class:`DaskWeightSyncScheme` with the same strategy, with a warning.
- :class:`DaskWeightUpdater` is the same route in TorchRL's legacy
  ``WeightUpdaterBase`` form. Any other subclass of ``WeightUpdaterBase`` that
  the user wrote is called as RayCollector calls it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import WeightUpdaterBase
from torchrl.weight_update import NoWeightSyncScheme, RayWeightSyncScheme, WeightSyncScheme
from torchrl.weight_update.weight_sync_schemes import register_weight_sync_backend

from daskcollect.errors import ConfigurationError

#: How the driver publishes: ``publish(weights, worker_ids)``, ``None`` meaning every collector.
Publish = Callable[[Any, "list[int] | None"], None]

_NO_WEIGHTS = (
    "There are no weights to send: this collector was built without a policy. Pass them, "
    "e.g. collector.update_policy_weights_(TensorDict.from_module(policy))."
)


class _Mailbox:
    """The receiving transport: holds the weights a rollout call brought until the scheme takes them."""

    def __init__(self) -> None:
        self._weights: TensorDictBase | None = None

    def send_weights(self, weights: TensorDictBase) -> None:
        self._weights = weights

    def receive_weights(self, timeout: float | None = None, **_: Any) -> TensorDictBase | None:
        weights, self._weights = self._weights, None
        return weights


@register_weight_sync_backend("dask")
class DaskWeightSyncScheme(WeightSyncScheme):
    """daskcollect's weight route (shared memory on the driver's host, a Dask scatter elsewhere).

    Pass it as ``weight_sync_schemes={"policy": DaskWeightSyncScheme()}``
    (TorchRL's ``WeightSyncScheme.from_backend("dask")`` builds one too), or
    subclass it (e.g. to map the weights in :meth:`prepare_weights`). Each
    update is written once per route and versioned; a collector loads it
    before its next rollout.

    Args:
        strategy: TorchRL's weight format, ``"tensordict"`` (default) or
            ``"state_dict"``; both travel as one consolidated TensorDict.
    """

    def __init__(self, strategy: str = "tensordict"):
        super().__init__(strategy)
        self._publish: Publish | None = None
        self._mailbox = _Mailbox()

    # --- the driver -----------------------------------------------------------
    def _init_on_sender_impl(self, *, model_id: str, context: Any = None, publish: Publish | None = None,
                             **_: Any) -> None:  # fmt: skip
        if publish is None:
            raise ConfigurationError(
                "DaskWeightSyncScheme is set up by DaskCollector: pass it in weight_sync_schemes=."
            )
        self.model_id = model_id
        self.context = context
        self._publish = publish

    def _setup_connection_and_weights_on_sender_impl(self, **_: Any) -> None:
        """Nothing to exchange: every collector starts from the weights shipped in its recipe."""

    def send(self, weights: Any = None, worker_ids: int | list[int] | None = None) -> None:
        """Publishes ``weights`` (default: the driver's policy) as a new version to ``worker_ids`` (default all).

        Returns once the weights are written; each collector loads them before
        its next rollout.

        Raises:
            ConfigurationError: If there are no weights, or they do not fit the policy.
        """
        if not self.initialized_on_sender or self._publish is None:
            raise RuntimeError(
                "DaskWeightSyncScheme.send() runs on the driver, once DaskCollector set it up."
            )
        prepared = self.prepare_weights(weights, self.model_id, self.strategy, self.context)
        if prepared is None or (isinstance(prepared, TensorDictBase) and prepared.is_empty()):
            raise ConfigurationError(_NO_WEIGHTS)
        if isinstance(prepared, Mapping) and not isinstance(prepared, TensorDictBase):
            # A state_dict: dotted keys, nested as TensorDict.from_module nests them.
            prepared = TensorDict(dict(prepared), batch_size=[]).unflatten_keys(".")
        ids = [worker_ids] if isinstance(worker_ids, int) else worker_ids
        self._publish(prepared, None if ids is None else list(ids))

    # --- a worker ---------------------------------------------------------------
    def _init_on_receiver_impl(self, *, model_id: str, context: Any = None, **_: Any) -> None:
        self.model_id = model_id
        self.context = context

    def _setup_connection_and_weights_on_receiver_impl(self, **_: Any) -> None:
        """Nothing to exchange: the collector was built with its first weights; later ones come with calls."""

    def create_transport(self, **_: Any) -> _Mailbox:
        return _Mailbox()

    def deliver(self, weights: TensorDictBase) -> None:
        """Hands weights a rollout call brought to the receiving side; ``receive()`` then applies them."""
        self._mailbox.send_weights(weights)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_publish"] = None  # the driver's handle stays on the driver
        return state

    def receive(self, timeout: float | None = None) -> TensorDictBase | None:
        """Applies the delivered weights: the collector served takes them (and cascades them, as TorchRL does).

        The policy the weights are for may live in the collector's own
        processes (a ``policy_factory`` under ``Multi*Collector``), so the
        weights go to the collector, never to a model resolved here.
        """
        if not self.initialized_on_receiver:
            raise RuntimeError("DaskWeightSyncScheme.receive() runs on a worker's collector.")
        weights = self._mailbox.receive_weights(timeout)
        if weights is not None and self.context is not None:
            self.context.update_policy_weights_(model_id=self.model_id or "policy", policy_or_weights=weights)
        return weights

    def shutdown(self) -> None:
        """Lets go of the collection; the scheme may then serve a new ``DaskCollector``."""
        self._publish = None
        super().shutdown()
        self.__setstate__(self.__getstate__())  # TorchRL's way to erase a scheme's state (its pickling)


with warnings.catch_warnings():
    # TorchRL deprecates subclassing WeightUpdaterBase, but RayCollector still takes weight_updater=.
    warnings.simplefilter("ignore", DeprecationWarning)

    class DaskWeightUpdater(WeightUpdaterBase):
        """daskcollect's weight route as TorchRL's legacy updater (``weight_updater=DaskWeightUpdater()``).

        One update is written once for all the collectors it reaches (not once
        per collector), after the hooks a subclass may override:
        ``_get_server_weights`` (default: the driver's policy),
        ``_maybe_map_weights`` and ``_skip_update(worker_id)``. Post-hooks run
        after each update.
        """

        def _owner(self) -> Any:
            collector = self.collector
            if collector is None:
                raise RuntimeError("This DaskWeightUpdater is not registered with a live DaskCollector.")
            return collector

        def all_worker_ids(self) -> list[int]:
            """The indices of the live collectors."""
            return self._owner().collector_indices()

        def _get_server_weights(self) -> Any:
            policy = self._owner().policy
            if policy is None:
                raise ConfigurationError(_NO_WEIGHTS)
            return policy

        def _maybe_map_weights(self, policy_or_weights: Any) -> Any:
            return policy_or_weights  # modules, TensorDicts and dicts are all taken as they are

        def _push_weights(self, *, policy_or_weights: Any = None, worker_ids: Any = None) -> None:
            weights = self._get_server_weights() if policy_or_weights is None else policy_or_weights
            weights = self._maybe_map_weights(weights)
            if isinstance(worker_ids, int):
                worker_ids = [worker_ids]
            ids = self.all_worker_ids() if worker_ids is None else list(worker_ids)
            ids = [i for i in ids if not self._skip_update(i)]
            if ids:
                self._owner().publish_weights(weights, ids)

        def _sync_weights_with_worker(self, *, worker_id: int | None = None, server_weights: Any) -> None:
            self._owner().publish_weights(server_weights, None if worker_id is None else [worker_id])


def _check_updater(updater: Any) -> None:
    cls = updater if isinstance(updater, type) else type(updater)
    if not (isinstance(cls, type) and issubclass(cls, WeightUpdaterBase)):
        raise ConfigurationError(
            f"weight_updater must be a torchrl WeightUpdaterBase (instance or class), got {cls.__name__}. "
            "Use daskcollect.DaskWeightUpdater, or weight_sync_schemes=."
        )
    if not issubclass(cls, DaskWeightUpdater) and cls.__module__.startswith("torchrl."):
        raise ConfigurationError(
            f"weight_updater={cls.__name__} pushes weights over {cls.__module__}'s own channels, which do "
            "not reach Dask actors. Pass daskcollect.DaskWeightUpdater() (or a subclass of it), or leave "
            "weight_updater out."
        )


def _check_scheme(scheme: Any) -> WeightSyncScheme:
    if isinstance(scheme, (DaskWeightSyncScheme, NoWeightSyncScheme)):
        if scheme.initialized_on_sender:
            raise ConfigurationError(
                f"This {type(scheme).__name__} already serves another collector. Pass a new scheme to "
                "each DaskCollector, e.g. weight_sync_schemes={'policy': DaskWeightSyncScheme()}."
            )
        return scheme
    if isinstance(scheme, RayWeightSyncScheme):
        warnings.warn(
            "RayWeightSyncScheme moves weights through Ray; DaskCollector uses "
            f"DaskWeightSyncScheme(strategy={scheme.strategy_str!r}) in its place.",
            stacklevel=5,
        )
        return DaskWeightSyncScheme(strategy=scheme.strategy_str)
    raise ConfigurationError(
        f"weight_sync_schemes['policy'] is a {type(scheme).__name__}, which cannot reach collectors that "
        "are Dask actors. Use daskcollect.DaskWeightSyncScheme() (the default), NoWeightSyncScheme() to "
        "turn updates off, or put the scheme in collector_kwargs['weight_sync_schemes'] for the "
        "processes of an inner Multi*Collector."
    )


def resolve(weight_updater: Any, weight_sync_schemes: Any) -> tuple[Any, dict[str, WeightSyncScheme] | None]:
    """Validates TorchRL's two weight keywords; returns ``(updater, schemes)``, one of them ``None``.

    With neither, the scheme is ``{"policy": DaskWeightSyncScheme()}``.

    Raises:
        ConfigurationError: For both keywords at once, a model other than
            ``"policy"``, or a scheme or updater that cannot reach Dask actors.
    """
    if weight_updater is not None and weight_sync_schemes is not None:
        raise ConfigurationError(
            "Pass weight_sync_schemes= or weight_updater=, not both (RayCollector would drop the updater)."
        )
    if weight_updater is not None:
        _check_updater(weight_updater)
        return weight_updater, None
    if weight_sync_schemes is None:
        return None, {"policy": DaskWeightSyncScheme()}
    if not isinstance(weight_sync_schemes, Mapping) or set(weight_sync_schemes) != {"policy"}:
        got = sorted(weight_sync_schemes) if isinstance(weight_sync_schemes, Mapping) else weight_sync_schemes
        raise ConfigurationError(
            f"weight_sync_schemes must map 'policy' (the one model DaskCollector syncs) to a scheme, got "
            f"{got!r}. Pass {{'policy': DaskWeightSyncScheme()}}, or {{'policy': NoWeightSyncScheme()}} to "
            "turn updates off."
        )
    return None, {"policy": _check_scheme(weight_sync_schemes["policy"])}


def receiver(updater: Any, schemes: Mapping[str, WeightSyncScheme] | None) -> DaskWeightSyncScheme | None:
    """The scheme each worker registers on its TorchRL collector (``None``: updates are off)."""
    if updater is not None:
        return DaskWeightSyncScheme()
    scheme = (schemes or {}).get("policy")
    return scheme if isinstance(scheme, DaskWeightSyncScheme) else None


def start_senders(schemes: Mapping[str, WeightSyncScheme] | None, context: Any, publish: Publish) -> None:
    """Runs the driver's side of TorchRL's two phases, ``init_on_sender`` then ``connect``."""
    for model_id, scheme in (schemes or {}).items():
        scheme.init_on_sender(model_id=model_id, context=context, publish=publish)
        if isinstance(scheme, DaskWeightSyncScheme):
            scheme.connect()  # NoWeightSyncScheme has nothing to connect


def policy_source(policy_or_weights: Any, weights: Any, policy: Any, kwargs: dict[str, Any]) -> Any:
    """The one weights source of ``update_policy_weights_``'s arguments; pops TorchRL's ``model_id`` and
    ``weights_dict`` from ``kwargs`` (one model, ``"policy"``, is synced).

    Raises:
        ConfigurationError: If weights are given twice, or for another model.
    """
    given = [x for x in (policy_or_weights, weights, policy) if x is not None]
    if len(given) > 1:
        raise ConfigurationError("Pass weights once: positionally, as weights= or as policy=.")
    weights_dict = kwargs.pop("weights_dict", None)
    models = set(weights_dict or ()) | {kwargs.pop("model_id", None) or "policy"}
    if models != {"policy"}:
        raise ConfigurationError(
            f"DaskCollector syncs one model, 'policy'; got {sorted(models)}. Pass the policy's "
            "weights without weights_dict or model_id."
        )
    return given[0] if given else (weights_dict or {}).get("policy")


class WeightsAPI:
    """TorchRL's weight methods as a collector's (a mixin of :class:`~daskcollect.DaskCollector`, before
    TorchRL's ``BaseCollector``, whose ``update_policy_weights_`` dispatches to the schemes or the updater;
    the collector holds ``_engine`` and ``policy`` and checks that it is open with ``_check_open``)."""

    _engine: Any
    policy: Any

    _check_open: Callable[[], None]  # the collector's: raises once it is closed

    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: int | Sequence[int] | None = None,
        **kwargs: Any,
    ) -> None:
        """Sends new policy weights to the collectors through ``weight_sync_schemes`` or ``weight_updater``.

        With the default :class:`~daskcollect.DaskWeightSyncScheme`, collectors
        on the driver's host read the weights from one shared-memory file
        written once; collectors on other hosts get one Dask scatter,
        replicated between their workers. Each collector loads them in place
        before its next rollout (a rollout already running finishes on the
        weights it started with).

        Args:
            policy_or_weights: An ``nn.Module``, a TensorDict of weights or a
                dict of tensors. Defaults to the driver's ``policy``.
            weights: Keyword form for weights.
            policy: Keyword form for a module.
            worker_ids: A collector index or a list of them; default all.
            **kwargs: TorchRL's ``model_id`` / ``weights_dict``; the only model is ``"policy"``.

        Raises:
            ConfigurationError: If there are no weights to send, they do not
                fit the policy, or the arguments conflict.
        """
        self._check_open()
        source = policy_source(policy_or_weights, weights, policy, kwargs)
        super().update_policy_weights_(source, worker_ids=worker_ids, **kwargs)  # TorchRL's dispatch

    def publish_weights(self, weights: Any, worker_ids: list[int] | None) -> None:
        """The route of this collection's schemes and updater (use :meth:`update_policy_weights_`): writes ``weights`` once per route as a new version for ``worker_ids`` (``None``: all)."""
        self._check_open()
        self._engine.send_weights(weights, self._engine.select(worker_ids))

    def collector_indices(self) -> list[int]:
        """The indices of the live collectors."""
        return [slot.index for slot in self._engine.select(None)]

    def _refresh_weights(self, slots: list) -> None:
        """``update_after_each_batch`` / ``max_weight_update_interval``: the driver's policy to ``slots``."""
        self.update_policy_weights_(self.policy, worker_ids=[slot.index for slot in slots])
