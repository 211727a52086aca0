"""One buffer per rollout: a batch packs into one frame, its schema travels once per stream and again when
it changes, and what cannot be packed keeps the leaf-by-leaf path."""

from __future__ import annotations

import pytest
import torch
from distributed.protocol import deserialize, serialize
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict
from test_streams_serialization import assert_same, nested_td, plain_td

from daskcollect.streams.packing import Packed, Packer
from daskcollect.streams.serialization import register_serializers
from daskcollect.worker.rollout import Rollout

register_serializers()


def rollout_of(batch) -> Rollout:
    return Rollout(index=0, uid=0, rollout_id=0, policy_version=0, seconds=0.0, cpu_seconds=0.0, batch=batch)


def through_dask(packed: Packed) -> tuple[TensorDict, list]:
    """The batch as the driver's comm rebuilds it, and the frames it travelled as."""
    header, frames = serialize(rollout_of(packed), serializers=["dask"])
    frames = [bytearray(f) for f in frames]  # what a TCP read hands over: writable memory
    return deserialize(header, frames).batch, frames


def rollout_td(n: int = 20, extra: bool = False) -> TensorDict:
    td = TensorDict(
        {
            "pixels": torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8),
            "action": torch.randn(n, 2),
            "done": torch.zeros(n, 1, dtype=torch.bool),
            "half": torch.randn(n, 3).to(torch.bfloat16),
            "next": {"reward": torch.randn(n, 1), "step": torch.arange(n, dtype=torch.int64)},
            "collector": {"traj_ids": torch.zeros(n, dtype=torch.int64)},
        },
        batch_size=[n],
        names=["time"],
    )
    if extra:
        td["late"] = torch.ones(n, 5, dtype=torch.float64)
    return td


@pytest.mark.parametrize(
    "make", [rollout_td, plain_td, lambda: plain_td().to("cpu")], ids=["rollout", "plain", "plain-on-cpu"]
)
def test_a_batch_travels_as_one_buffer_and_comes_back_equal(make):
    td = make()
    back, frames = through_dask(Packer().pack(td, stream=1))
    assert_same(td, back)
    assert len(frames) == 2  # the header, and one buffer for every leaf
    start = torch.frombuffer(frames[1], dtype=torch.uint8).data_ptr()
    leaves = list(back.values(True, True))
    storages = {t.untyped_storage().data_ptr() for t in leaves}
    assert all(start <= ptr < start + len(frames[1]) for ptr in storages)  # views over the frame, no copy
    assert len(storages) == len({t.dtype for t in leaves})  # one storage per dtype


def test_a_rebuilt_batch_saves_and_loads_with_torch(tmp_path):
    """Each dtype's leaves view a storage of their own: torch.save refuses a storage seen as two dtypes."""
    back, _ = through_dask(Packer().pack(rollout_td(), stream=1))
    torch.save(back, tmp_path / "batch.pt")
    assert_same(back, torch.load(tmp_path / "batch.pt", weights_only=False))


def test_the_schema_travels_once_per_stream_and_again_when_it_changes():
    packer = Packer()
    first, again, other = (
        packer.pack(rollout_td(), 1),
        packer.pack(rollout_td(), 1),
        packer.pack(rollout_td(), 2),
    )
    assert first.schema is not None and again.schema is None and other.schema is not None
    sizes = []
    for packed in (first, again, other):
        back, frames = through_dask(packed)
        assert_same(rollout_td().apply(torch.zeros_like), back.apply(torch.zeros_like))
        sizes.append(len(frames[0]))
    assert sizes[1] < sizes[0] / 2 and sizes[2] == sizes[0]  # the header without the schema is small
    for changed in (rollout_td(n=7), rollout_td(extra=True)):  # a new shape, a new key: a new schema
        packed = packer.pack(changed, 1)
        assert packed.schema is not None
        assert_same(changed, through_dask(packed)[0])
    assert packer.pack(rollout_td(extra=True), 1).schema is None


def test_a_stream_whose_schema_the_driver_never_saw_fails_to_read():
    data = Packer().pack(rollout_td(), 12345).data
    header, frames = serialize(rollout_of(Packed(424242, None, data)), serializers=["dask"])
    with pytest.raises(KeyError):
        deserialize(header, [bytearray(f) for f in frames])


@pytest.mark.parametrize(
    "make",
    [
        nested_td,  # non-tensor data
        lambda: LazyStackedTensorDict(*[plain_td(), plain_td()], stack_dim=0),
        lambda: TensorDict({"x": torch.randn(3, requires_grad=True)}, [3]),
        lambda: TensorDict({"label": NonTensorData("a", batch_size=[2])}, [2]),
    ],
    ids=["non-tensor", "lazy-stack", "requires-grad", "only-non-tensor"],
)
def test_what_cannot_be_packed_is_left_to_the_leaf_by_leaf_path(make):
    assert Packer().pack(make(), stream=1) is None
