"""The TensorDict serializer: out-of-band frames, round trips, registration on workers."""

from __future__ import annotations

import pickle

import pytest
import torch
from distributed.protocol import deserialize, serialize
from helpers import fresh_python
from makers import make_pixel_env
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict

from daskcollect import DaskCollector
from daskcollect.streams.serialization import register_serializers
from daskcollect.worker.rollout import Rollout

register_serializers()  # what a DaskCollector does on the driver, and its plugin on the workers


def test_importing_daskcollect_registers_no_serializer():
    """Only building a collector (or calling register_serializers) touches Dask's serializers."""
    code = (
        "import daskcollect, pytest\n"
        "from distributed.protocol.serialize import dask_serialize\n"
        "from tensordict import TensorDict\n"
        "with pytest.raises(TypeError): dask_serialize.dispatch(TensorDict)\n"
        "from daskcollect.streams.serialization import register_serializers\n"
        "register_serializers()\n"
        "assert dask_serialize.dispatch(TensorDict) is not None\n"
        "print('ok')\n"
    )
    assert fresh_python(code, timeout=120) == "ok"


def nested_td() -> TensorDict:
    return TensorDict(
        {
            "pixels": torch.randint(0, 256, (10, 8, 8, 3), dtype=torch.uint8),
            "nested": {"reward": torch.randn(10, 1), "done": torch.zeros(10, 1, dtype=torch.bool)},
            "half": torch.randn(10, 2).to(torch.bfloat16),
            "strided": torch.randn(4, 10).t(),  # not contiguous
            "label": NonTensorData("episode-7", batch_size=[10]),
        },
        batch_size=[10],
        names=["time"],
    )


def plain_td() -> TensorDict:
    """Tensors and TensorDicts only: the fast path, with partial names and a nested TensorDict of
    more batch dims than its parent."""
    return TensorDict(
        {
            "obs": torch.randn(10, 4),
            "empty": torch.zeros(10, 0),
            "scalar": torch.tensor(3.0).expand(10),  # not contiguous
            "inner": TensorDict(
                {"x": torch.arange(30).reshape(10, 3)}, batch_size=[10, 3], names=["time", "arm"]
            ),
        },
        batch_size=[10],
        names=["time"],
    )


def assert_same(a, b) -> None:
    assert type(a) is type(b)
    assert a.batch_size == b.batch_size and a.names == b.names and a.device == b.device
    assert a._has_names() == b._has_names()
    for key in a.keys(True):
        if isinstance(a.get(key), TensorDict):  # nested ones keep their own batch dims and names
            assert a.get(key).batch_size == b.get(key).batch_size and a.get(key).names == b.get(key).names
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x, y)
        else:
            assert x == y


@pytest.mark.parametrize(
    "make",
    [
        nested_td,
        lambda: nested_td().to("cpu"),  # device="cpu" is kept
        lambda: LazyStackedTensorDict(*[nested_td(), nested_td()], stack_dim=0),
        plain_td,
        lambda: plain_td().to("cpu"),
    ],
    ids=["nested", "on-cpu", "lazy-stack", "plain", "plain-on-cpu"],
)
def test_roundtrip_through_dask_protocol(make):
    td = make()
    header, frames = serialize(td)
    assert header["serializer"] == "dask"
    out = deserialize(header, frames)
    assert_same(out, td)


def test_tensor_data_is_out_of_band():
    td = TensorDict({"pixels": torch.randint(0, 256, (100, 84, 84, 3), dtype=torch.uint8)}, [100])
    header, frames = serialize(td)
    data_bytes = td["pixels"].numel()
    pickle_frame = memoryview(frames[0]).nbytes
    assert pickle_frame < 4096  # structure only: no tensor bytes inside the pickle stream
    assert sum(memoryview(f).nbytes for f in frames[1:]) == data_bytes
    # The out-of-band frame references the tensor's memory: no copy on the way out.
    assert memoryview(frames[1]).obj is not None
    default = pickle.dumps(td)  # Dask's fallback would copy the bytes into the stream
    assert len(default) > data_bytes


def test_rollout_serializes_its_batch_out_of_band():
    td = nested_td()
    rollout = Rollout(0, 0, 3, 1, 0.5, 0.4, batch=td, batch_size=td.batch_size, frames=10)
    header, frames = serialize(rollout)
    assert len(frames) > 1 and memoryview(frames[0]).nbytes < 4096
    out = deserialize(header, frames)
    assert out.rollout_id == 3 and out.policy_version == 1
    assert_same(out.batch, td)


def test_registered_on_workers_and_batches_arrive_intact(client):
    def roundtrip_on_worker(td):
        from distributed.protocol import deserialize, serialize

        header, frames = serialize(td)
        return header["serializer"], len(frames), deserialize(header, frames)

    with DaskCollector(make_pixel_env, frames_per_batch=20, total_frames=40, client=client) as collector:
        batches = list(collector)
        # The plugin registered the serializer on the workers (not only our actor module).
        sent = nested_td()
        kind, nframes, back = client.submit(roundtrip_on_worker, sent, pure=False).result(timeout=30)
    assert batches[0]["pixels"].shape == torch.Size([20, 84, 84, 3])
    assert batches[0]["pixels"].dtype == torch.uint8
    assert batches[0]["next", "pixels"].shape == torch.Size([20, 84, 84, 3])
    assert kind == "dask" and nframes > 1
    assert_same(back, sent)
