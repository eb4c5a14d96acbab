"""config.pbtxt's model_warmup samples as tensors (gpu_executor/warm_samples.py): zero_data, random_data
(seeded: the same every start), input_data_file (raw little-endian bytes; BYTES as length-prefixed
elements, as Triton reads them), ``batch_size`` rows stacked or whole shapes."""
from __future__ import annotations

import struct

import numpy as np

from aieng.gpu_executor.warm_samples import feeds
from aieng.models.sections import WarmupInput, WarmupSample


def sample(*inputs: WarmupInput, batch_size: int = 2) -> WarmupSample:
    return WarmupSample("w", batch_size, 1, inputs)


def test_zero_random_and_file_rows(tmp_path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x").write_bytes(np.arange(4, dtype="<f4").tobytes())
    s = sample(WarmupInput("z", "INT32", (3,), "zero_data"), WarmupInput("r", "FP32", (2, 2), "random_data"),
               WarmupInput("x", "FP32", (4,), "input_data_file", "x"))
    dtypes = {"z": np.dtype(np.int32), "r": np.dtype(np.float32), "x": np.dtype(np.float32)}
    got = feeds(s, dtypes, str(tmp_path))
    assert got["z"].shape == (2, 3) and not got["z"].any() and got["z"].dtype == np.int32
    assert got["r"].shape == (2, 2, 2) and got["r"].dtype == np.float32
    np.testing.assert_array_equal(got["r"], feeds(s, dtypes, str(tmp_path))["r"])  # seeded
    np.testing.assert_array_equal(got["x"], np.stack([np.arange(4, dtype=np.float32)] * 2))


def test_bytes_from_a_file_and_whole_shapes(tmp_path):
    (tmp_path / "warmup").mkdir()
    raw = b"".join(struct.pack("<I", len(t)) + t for t in (b"ab", b"", b"xyz"))
    (tmp_path / "warmup" / "s").write_bytes(raw)
    s = sample(WarmupInput("s", "BYTES", (3,), "input_data_file", "s"), batch_size=5)
    got = feeds(s, {"s": np.dtype(object)}, str(tmp_path), batched=False)
    assert got["s"].shape == (3,) and list(got["s"]) == [b"ab", b"", b"xyz"]
    zero = feeds(sample(WarmupInput("s", "BYTES", (2,), "zero_data")), {"s": np.dtype(object)}, str(tmp_path))
    assert zero["s"].shape == (2, 2) and zero["s"].dtype == object and set(zero["s"].ravel()) == {b""}
