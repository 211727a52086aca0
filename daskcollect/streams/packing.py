"""One buffer per rollout: a batch's leaves packed into one aligned byte buffer, its schema sent once.

A rollout batch pickled leaf by leaf travels as one out-of-band frame per
tensor, and Dask's TCP comm reads each frame with its own read and Future
(distributed PR #8308): a 20-leaf batch costs about 20 awaits on the driver's
event loop, then 20 tensors rebuilt. Here the worker copies every leaf into one
buffer, at offsets aligned to :data:`ALIGN` bytes, so the batch is one frame;
and the layout (:class:`Schema`: each TensorDict's batch size and device, each
leaf's key, dtype, shape and offset) travels only with a stream's first batch
and when it changes, as tensordict's ``TensorDictPipe`` sends a schema once.
The driver rebuilds the TensorDict as views over the frame it received, with no
copy: one strided view per leaf, over one tensor per dtype (each its own storage, so that
``torch.save`` takes the batch as it takes any other).

Only plain TensorDicts of CPU tensors are packed (no lazy stacks, non-tensor
data or gradients); anything else keeps the leaf-by-leaf path of
:mod:`daskcollect.streams.serialization`, which is also what tensordict's
``consolidate()`` would give without its per-batch metadata.
"""

from __future__ import annotations

import math
import pickle
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from daskcollect import _internals
from daskcollect.streams.serialization import byte_view, writable

#: Leaves start at multiples of this many bytes: any dtype's view lines up, and so do cache lines.
ALIGN = 64

#: Schemas the driver keeps, by stream: a stream's batches name its schema instead of carrying it.
KEPT_SCHEMAS = 8192

_new_tensordict = _internals.tensordict_unchecked()


@dataclass(frozen=True)
class Leaf:
    """Where one tensor lies in the packed buffer."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    #: Offset in elements from the start of its dtype's region.
    offset: int


@dataclass(frozen=True)
class Node:
    """One TensorDict of the batch: its batch size, device, dimension names, leaves and nested
    TensorDicts, in order."""

    batch_size: tuple[int, ...]
    device: str | None
    names: tuple[str | None, ...] | None
    entries: tuple[Leaf | tuple[str, Node], ...]


@dataclass(frozen=True)
class Schema:
    """A packed batch's layout: the root :class:`Node`, one region per dtype and the buffer's size.

    The leaves of one dtype lie together in their region, each region starting at a multiple of
    :data:`ALIGN`: the driver views each region as a tensor of its own, so no storage is viewed as two
    dtypes (``torch.save`` refuses that).
    """

    root: Node
    #: ``(dtype, byte offset, elements)`` per region.
    regions: tuple[tuple[torch.dtype, int, int], ...]
    nbytes: int


def _walk(td: Any, leaves: list[torch.Tensor], signature: list) -> bool:
    """Appends ``td``'s tensors to ``leaves`` and its layout to ``signature``; ``False`` if it cannot be
    packed (not a plain TensorDict of plain CPU tensors)."""
    if type(td) is not TensorDict:
        return False
    device = td.device
    if device is not None and device.type != "cpu":
        return False
    names = tuple(td.names)
    names = None if all(name is None for name in names) else names
    signature.append((tuple(td.batch_size), None if device is None else str(device), names))
    for key, value in td.items():
        if type(value) is torch.Tensor:
            if value.device.type != "cpu" or value.layout != torch.strided or value.requires_grad:
                return False
            leaves.append(value)
            signature.append((key, value.dtype, tuple(value.shape)))
        elif type(value) is TensorDict:
            signature.append(key)
            if not _walk(value, leaves, signature):
                return False
        else:
            return False
    signature.append(None)  # this TensorDict ends
    return True


def _schema(signature: list) -> Schema:
    """The :class:`Schema` of a signature built by :func:`_walk`."""
    used: dict[torch.dtype, int] = {}  # elements placed so far in each dtype's region
    items = iter(signature)

    def node(head: tuple) -> Node:
        entries: list[Leaf | tuple[str, Node]] = []
        for item in items:
            if item is None:
                break
            if isinstance(item, str):
                entries.append((item, node(next(items))))
                continue
            key, dtype, shape = item
            stride = tuple(torch.empty(shape, device="meta").stride())
            entries.append(Leaf(key, dtype, shape, stride, used.get(dtype, 0)))
            used[dtype] = used.get(dtype, 0) + math.prod(shape)
        return Node(*head, tuple(entries))

    root = node(next(items))
    regions, position = [], 0
    for dtype, numel in used.items():
        regions.append((dtype, position, numel))
        position += -(-numel * dtype.itemsize // ALIGN) * ALIGN
    return Schema(root, tuple(regions), position)


class Packed:
    """A batch packed for one stream: unpickled, it is the TensorDict again (views over the frame).

    Args:
        stream: The stream's token (its schemas are kept under it on the driver).
        schema: The layout, where this stream has not sent it yet; else ``None``.
        data: The packed buffer (``uint8``).
    """

    __slots__ = ("data", "schema", "stream")

    def __init__(self, stream: int, schema: Schema | None, data: torch.Tensor):
        self.stream, self.schema, self.data = stream, schema, data

    def __reduce__(self) -> tuple:
        return unpack, (self.stream, self.schema, pickle.PickleBuffer(byte_view(self.data)))


class Packer:
    """Packs one collector's batches for its streams (the actor's thread, one batch at a time)."""

    def __init__(self) -> None:
        self._signature: list | None = None
        self._schema: Schema | None = None
        self._leaves: list[Leaf] = []  # the schema's leaves in the order _walk finds the tensors
        self._sent_on: set[int] = set()

    def pack(self, td: Any, stream: int) -> Packed | None:
        """``td`` as one buffer for ``stream``; ``None`` where it cannot be packed."""
        leaves: list[torch.Tensor] = []
        signature: list = []
        if not _walk(td, leaves, signature):
            return None
        if signature != self._signature:
            self._signature, self._schema, self._sent_on = signature, _schema(signature), set()
            self._leaves = _leaves(self._schema.root)
        schema = self._schema
        data = torch.empty(schema.nbytes, dtype=torch.uint8)
        typed = {dtype: (data.view(dtype), start // dtype.itemsize) for dtype, start, _ in schema.regions}
        for leaf, value in zip(self._leaves, leaves):
            region, base = typed[leaf.dtype]
            region.as_strided(leaf.shape, leaf.stride, base + leaf.offset).copy_(value)
        first = stream not in self._sent_on
        self._sent_on.add(stream)
        return Packed(stream, schema if first else None, data)


def _leaves(node: Node) -> list[Leaf]:
    out: list[Leaf] = []
    for entry in node.entries:
        if isinstance(entry, Leaf):
            out.append(entry)
        else:
            out.extend(_leaves(entry[1]))
    return out


# --- the driver's side ------------------------------------------------------------
_schemas: OrderedDict[int, Schema] = OrderedDict()
_schemas_lock = threading.Lock()


def unpack(stream: int, schema: Schema | None, frame: Any) -> TensorDict:
    """The TensorDict of a :class:`Packed` batch, as views over ``frame`` (runs at unpickling).

    Raises:
        KeyError: If ``stream``'s schema was never received (or dropped after :data:`KEPT_SCHEMAS` newer streams).
    """
    with _schemas_lock:
        if schema is not None:
            _schemas[stream] = schema
            if len(_schemas) > KEPT_SCHEMAS:
                _schemas.popitem(last=False)
        else:
            schema = _schemas[stream]
    frame = writable(frame)
    # One tensor per region, each over a storage of its own that starts at the region.
    typed = {
        dtype: torch.frombuffer(frame, dtype=dtype, count=n, offset=start)
        if n
        else torch.empty(0, dtype=dtype)
        for dtype, start, n in schema.regions
    }
    return _rebuild(schema.root, typed)


def _rebuild(node: Node, typed: dict[torch.dtype, torch.Tensor]) -> TensorDict:
    values: dict[str, Any] = {}
    for entry in node.entries:
        if isinstance(entry, Leaf):
            values[entry.key] = typed[entry.dtype].as_strided(entry.shape, entry.stride, entry.offset)
        else:
            values[entry[0]] = _rebuild(entry[1], typed)
    return _new_tensordict(
        values, batch_size=torch.Size(node.batch_size), device=node.device, names=node.names
    )
