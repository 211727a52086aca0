"""A Dask serializer for TensorDicts: tensor data travels as out-of-band frames.

Dask has no serializer for TensorDicts, so by default it pickles them and every
tensor's bytes are copied into the pickle stream. Here the TensorDict's
structure (keys, batch size, names, device, non-tensor data, lazy stacks) is
still pickled, but each CPU tensor is reduced to a ``uint8`` NumPy view, which
pickle protocol 5 hands out as a separate buffer: Dask sends those buffers as
frames that reference the tensors' memory. On the receiving side the tensors
are rebuilt over the received frames, without another copy.

Importing this module changes nothing: :func:`register_serializers` installs
the serializer, called by each ``DaskCollector`` on the driver and by the
worker plugin on every worker, so a user's process is only affected once it
builds a collector.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import torch
from distributed.protocol import dask_deserialize, dask_serialize
from tensordict import TensorDict, TensorDictBase

from daskcollect import _internals

# The sender's TensorDict already satisfied the checks of the public constructor.
_new_tensordict = _internals.tensordict_unchecked()


def byte_view(tensor: torch.Tensor) -> np.ndarray:
    """A flat ``uint8`` NumPy view of a CPU tensor's data (copied only if not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def writable(data: Any) -> Any:
    """``data``, or a writable copy of it where it is read-only: torch tensors must own writable memory."""
    view = memoryview(data)
    return bytearray(view) if view.readonly else data


def from_byte_view(data: Any, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """The inverse of :func:`byte_view`: a tensor over ``data``'s memory (copied if read-only)."""
    data = writable(data)
    if not memoryview(data).nbytes:
        return torch.empty(shape, dtype=dtype)  # frombuffer refuses an empty buffer
    return torch.frombuffer(data, dtype=dtype).view(shape)


def _rebuild_tensor(data: Any, dtype: torch.dtype, shape: tuple, requires_grad: bool) -> torch.Tensor:
    tensor = from_byte_view(data, dtype, shape)
    if requires_grad:
        tensor.requires_grad_()
    return tensor


def _rebuild_tensordict(keys: tuple, values: tuple, batch_size: tuple, device: Any, names: Any) -> TensorDict:
    return _new_tensordict(
        dict(zip(keys, values)), batch_size=torch.Size(batch_size), device=device, names=names
    )


def _reduce_tensordict(td: TensorDict) -> tuple | None:
    """A plain TensorDict (tensors and plain TensorDicts only, unlocked) as its keys and values.

    Its nested TensorDicts and tensors are reduced in turn by the pickler.
    TensorDict's own pickling goes through a generic state dict and rebuilds
    through the checking constructor (24 us for a 3-level rollout batch,
    against 4 us here). Anything else (non-tensor data, lazy stacks, locked
    TensorDicts) returns ``None`` and keeps TensorDict's own.
    """
    if td.is_locked:
        return None
    keys, values = [], []
    for key, value in td.items():
        if type(value) is not torch.Tensor and type(value) is not TensorDict:
            return None
        keys.append(key)
        values.append(value)
    names = td.names
    names = None if all(name is None for name in names) else names
    return _rebuild_tensordict, (tuple(keys), tuple(values), tuple(td.batch_size), td.device, names)


class _OutOfBandPickler(pickle.Pickler):
    """Pickles plain CPU tensors as out-of-band byte buffers, and plain TensorDicts as their items."""

    def reducer_override(self, obj):
        kind = type(obj)
        if kind is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided:
            data = pickle.PickleBuffer(byte_view(obj))  # out of band as the frame itself, not a NumPy array
            return _rebuild_tensor, (data, obj.dtype, tuple(obj.shape), obj.requires_grad)
        if kind is TensorDict:
            reduced = _reduce_tensordict(obj)
            if reduced is not None:
                return reduced
        return NotImplemented


def dumps(obj: Any) -> list:
    """Pickles ``obj`` with its tensors as out-of-band buffers.

    Returns:
        ``[pickle_bytes, buffer, ...]``: the buffers reference the tensors' memory.
    """
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _OutOfBandPickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    return [stream.getvalue(), *(b.raw() for b in buffers)]


def loads(frames: list) -> Any:
    """Inverse of :func:`dumps`; tensors view the given frames."""
    return pickle.loads(frames[0], buffers=frames[1:])


def _serialize(obj: Any) -> tuple[dict, list]:
    if isinstance(obj, TensorDictBase) and obj.device is not None and obj.device.type != "cpu":
        obj = obj.to("cpu")  # CUDA tensors do not serialize
    frames = dumps(obj)
    return {"nbuffers": len(frames) - 1}, frames


def _deserialize(header: dict, frames: list) -> Any:
    return loads(frames)


def _register(cls: type) -> None:
    dask_serialize.register(cls)(_serialize)
    dask_deserialize.register(cls)(_deserialize)


def register_serializers() -> None:
    """Makes Dask serialize TensorDicts and daskcollect's containers of them with :func:`dumps`.

    Idempotent. Covers ``TensorDictBase`` (and subclasses), the rollout record
    and the weights payload.
    """
    from daskcollect.weights.payload import WeightsPayload
    from daskcollect.worker.rollout import Rollout

    for cls in (TensorDictBase, Rollout, WeightsPayload):
        _register(cls)
