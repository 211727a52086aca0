"""Weights taken from a policy, packed once into one storage, and what a transport hands back.

Extraction delegates to TorchRL's ``WeightStrategy`` (``extract_as="tensordict"``),
which also carries a module's ``get_extra_state()`` (running statistics such
as ``VecNorm``'s). The weights are then packed with ``TensorDict.consolidate``
into one contiguous storage: it pickles as that storage plus a small metadata
dict, so daskcollect's serializer sends the bytes as one out-of-band frame,
and the shared-memory transport writes them with one copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tensordict import TensorDict, TensorDictBase
from torch import nn

from daskcollect.errors import ConfigurationError


def extract_weights(source: Any) -> TensorDictBase:
    """Returns detached CPU weights from a module, a TensorDict or a dict of tensors.

    Args:
        source: An ``nn.Module`` (``TensorDictModule`` included), a TensorDict,
            or a (nested) dict of tensors.

    Raises:
        ConfigurationError: If ``source`` is none of those.
    """
    if not isinstance(source, (nn.Module, TensorDictBase, dict)):
        raise ConfigurationError(
            f"Cannot take policy weights from {type(source).__name__}. Pass an nn.Module, "
            "a TensorDict of weights (TensorDict.from_module(policy)) or a dict of tensors."
        )
    from torchrl.weight_update.weight_sync_schemes import WeightStrategy  # driver only

    weights = WeightStrategy(extract_as="tensordict").extract_weights(source)
    if not isinstance(weights, TensorDictBase):
        weights = TensorDict(weights, batch_size=[])
    # CUDA tensors do not serialize: weights always leave the driver on CPU.
    return weights.detach().to("cpu")


@dataclass(frozen=True)
class WeightsPayload:
    """One weights version, consolidated into a single storage.

    Attributes:
        version: The driver's policy version these weights carry.
        weights: The consolidated TensorDict.
    """

    version: int
    weights: TensorDictBase

    @classmethod
    def pack(cls, weights: TensorDictBase, version: int, filename: str | None = None) -> WeightsPayload:
        """Copies ``weights`` once into one storage (in memory, or the file ``filename``)."""
        if weights.is_consolidated():
            weights = weights.copy()  # consolidate() returns a consolidated TensorDict as it is
        return cls(version, weights.consolidate(filename=filename))

    @property
    def nbytes(self) -> int:
        """Bytes of the weights' tensors (the consolidated storage, less its padding)."""
        return self.weights.bytes()


class WeightsRef(Protocol):
    """What a rollout call carries to a worker: a weights version and how to read it there."""

    version: int

    def read(self, worker: Any, timeout: float) -> TensorDictBase:
        """The weights, on the worker (``worker`` is the Dask worker)."""


@dataclass(frozen=True)
class Sent:
    """A weights version handed to a transport.

    Attributes:
        ref: What rollout calls carry to the workers.
        payload: The weights, kept to send them again to a new collector.
        keepalive: What keeps the transported copy alive (a Dask future, a
            shared-memory file's handle) while anyone holds this.
        route: The transport's name, ``"shared-memory"`` or ``"dask"``.
    """

    ref: WeightsRef
    payload: WeightsPayload
    keepalive: Any
    route: str

    @property
    def version(self) -> int:
        return self.payload.version
