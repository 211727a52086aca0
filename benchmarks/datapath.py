"""P4: the cost of moving a pixel batch from a worker to the driver, by transport.

A batch of 1000 frames with 84x84x3 uint8 observations and next-observations
(about 42 MB) travels from a worker of a loopback LocalCluster to the driver:

- ``pickle``: Dask's default for a TensorDict (the tensor bytes go into the pickle stream);
- ``daskcollect``: our serializer (tensor bytes as out-of-band frames);
- ``memmap``: the worker writes the batch once to a shared folder and returns a
  small handle; the driver memory-maps it (and, in ``memmap+read``, reads every byte).

    python benchmarks/datapath.py --repeats 10

Writes benchmarks/results/datapath.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings

import torch
from _common import header, save
from distributed import Client, LocalCluster
from distributed.protocol import serialize
from tensordict import TensorDict

from daskcollect.collection.memmap import write_batch
from daskcollect.streams.serialization import register_serializers

warnings.filterwarnings("ignore")
_CACHE: dict = {}


def make_batch(frames: int = 1000, size: int = 84) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (frames + 1, size, size, 3), dtype=torch.uint8, generator=g)
    return TensorDict(
        {
            "pixels": pixels[:-1].clone(),
            "action": torch.zeros(frames, 2),
            "next": {"pixels": pixels[1:].clone(), "reward": torch.ones(frames, 1)},
        },
        batch_size=[frames],
        names=["time"],
    )


class Pickled:
    """A wrapper Dask has no serializer for: it pickles it, and the TensorDict inside."""

    def __init__(self, td):
        self.td = td


def worker_batch(kind: str, memmap_dir: str, i: int):
    """Runs on the worker: returns the cached batch by ``kind``."""
    td = _CACHE.setdefault("batch", make_batch())
    if kind == "pickle":
        return Pickled(td)
    if kind == "daskcollect":
        return td
    return write_batch(td, memmap_dir, f"batch-{i}")


def in_band_bytes(obj) -> tuple[int, int]:
    """(bytes of the first frame, the pickle stream; bytes of the other, out-of-band frames)."""
    _, frames = serialize(obj)
    sizes = [memoryview(f).nbytes for f in frames]
    return sizes[0], sum(sizes[1:])


def main() -> None:
    register_serializers()  # as a DaskCollector does
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    batch = make_batch()
    nbytes = sum(t.numel() * t.element_size() for t in batch.values(True, True))
    memmap_dir = tempfile.mkdtemp(prefix="daskcollect-datapath-")
    sizes = {
        "pickle": in_band_bytes(Pickled(batch)),
        "daskcollect": in_band_bytes(batch),
        "memmap": in_band_bytes(os.path.join(memmap_dir, "batch-0")),
    }
    times: dict[str, list[float]] = {k: [] for k in ("pickle", "daskcollect", "memmap", "memmap+read")}
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster:
        with Client(cluster) as client:
            client.submit(worker_batch, "daskcollect", memmap_dir, -1, pure=False).result()  # warm up
            for i in range(args.repeats):  # interleaved: A B C A B C ...
                for kind in ("pickle", "daskcollect", "memmap"):
                    start = time.perf_counter()
                    out = client.submit(worker_batch, kind, memmap_dir, i, pure=False).result()
                    if kind == "memmap":
                        td = TensorDict.load_memmap(out)
                        times["memmap"].append(time.perf_counter() - start)
                        int(td["pixels"].sum()) + int(td["next", "pixels"].sum())  # read every byte
                        times["memmap+read"].append(time.perf_counter() - start)
                        shutil.rmtree(out)
                    else:
                        td = out.td if kind == "pickle" else out
                        assert td["pixels"].shape == batch["pixels"].shape
                        times[kind].append(time.perf_counter() - start)
    shutil.rmtree(memmap_dir, ignore_errors=True)

    rows = {
        kind: {
            "median_ms": 1e3 * statistics.median(v),
            "in_band_pickle_bytes": sizes[kind.split("+")[0]][0],
            "out_of_band_bytes": sizes[kind.split("+")[0]][1],
            "disk_bytes_written": nbytes if kind.startswith("memmap") else 0,
        }
        for kind, v in times.items()
    }
    result = {**header("P4-datapath", args), "batch_bytes": nbytes, "raw_seconds": times, "summary": rows}
    save(result, "datapath", args.out)
    print(f"batch: {nbytes / 1e6:.1f} MB")
    print(f"{'transport':14s} {'ms/batch':>9s} {'pickled bytes':>14s} {'out-of-band':>12s} {'disk':>10s}")
    for kind, r in rows.items():
        print(
            f"{kind:14s} {r['median_ms']:9.1f} {r['in_band_pickle_bytes']:14,d} "
            f"{r['out_of_band_bytes']:12,d} {r['disk_bytes_written']:10,d}"
        )


if __name__ == "__main__":
    main()
