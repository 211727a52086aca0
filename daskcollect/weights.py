"""Policy weights: extraction on the driver, a zero-copy payload, loading on workers.

The driver turns weights into a :class:`WeightsPayload` whose tensors are raw
``uint8`` NumPy views. Dask pickles NumPy arrays with protocol 5 out-of-band
buffers, so the bytes are serialized once, without a copy, whatever the dtype
(``bfloat16`` included). Each update is written once: into shared memory for
workers on the driver's host (:mod:`daskcollect.sharedmem`), and scattered
once for workers elsewhere, replicated between them by Dask. Rollout calls only
carry a small :class:`WeightsRef`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from daskcollect.errors import ConfigurationError

if TYPE_CHECKING:
    from daskcollect.sharedmem import Layout


def extract_weights(source: Any) -> TensorDictBase:
    """Returns CPU weights from a module, a TensorDict or a dict of tensors.

    Args:
        source: An ``nn.Module`` (``TensorDictModule`` included), a TensorDict,
            or a (nested) dict of tensors.

    Raises:
        ConfigurationError: If ``source`` holds no weights.
    """
    if isinstance(source, nn.Module):
        weights = TensorDict.from_module(source).data
    elif isinstance(source, TensorDictBase):
        weights = source.data if hasattr(source, "data") else source
    elif isinstance(source, dict):
        weights = TensorDict(source, batch_size=[])
    else:
        raise ConfigurationError(
            f"Cannot take policy weights from {type(source).__name__}. Pass an nn.Module, "
            "a TensorDict of weights (TensorDict.from_module(policy)) or a dict of tensors."
        )
    # CUDA tensors do not serialize: weights always leave the driver on CPU.
    return weights.detach().to("cpu")


@dataclass(frozen=True)
class WeightsPayload:
    """Weights as raw byte views, serialized once and without a copy.

    Attributes:
        version: The driver's policy version these weights carry.
        keys: Nested keys of the weights TensorDict.
        dtypes: One dtype per key.
        shapes: One shape per key.
        buffers: One contiguous ``uint8`` array per key.
    """

    version: int
    keys: tuple
    dtypes: tuple
    shapes: tuple
    buffers: tuple

    @classmethod
    def from_tensordict(cls, weights: TensorDictBase, version: int) -> WeightsPayload:
        keys, dtypes, shapes, buffers = [], [], [], []
        for key, tensor in weights.items(include_nested=True, leaves_only=True):
            tensor = tensor.contiguous()
            keys.append(key)
            dtypes.append(tensor.dtype)
            shapes.append(tuple(tensor.shape))
            buffers.append(tensor.reshape(-1).view(torch.uint8).numpy())
        return cls(version, tuple(keys), tuple(dtypes), tuple(shapes), tuple(buffers))

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def to_tensordict(self) -> TensorDict:
        """Rebuilds the weights as a TensorDict viewing the received buffers."""
        out = TensorDict()
        with warnings.catch_warnings():
            # Received frames can be read-only; the worker only copies from them.
            warnings.simplefilter("ignore", UserWarning)
            for key, dtype, shape, buf in zip(self.keys, self.dtypes, self.shapes, self.buffers):
                flat = torch.from_numpy(np.asarray(buf))
                out.set(key, flat.view(dtype).reshape(shape))
        return out


@dataclass(frozen=True)
class WeightsRef:
    """What a rollout call carries: where to find a weights version.

    Attributes:
        key: The Dask key of a scattered :class:`WeightsPayload` (``None`` for
            weights in shared memory).
        version: Its version, so that a worker skips weights it already has.
        path: A shared-memory file on the driver's host holding the weights
            (:mod:`daskcollect.sharedmem`), for workers on that host.
        layout: Where each tensor lies in that file.
    """

    key: str | None
    version: int
    path: str | None = None
    layout: Layout | None = None
