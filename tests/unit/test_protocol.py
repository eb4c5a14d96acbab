"""Unit tests for aieng/wire/protocol.py: the external wire contract."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng.wire import protocol as p
from aieng.wire.protocol import INVALID_INPUT, RequestError, decode_tensor, encode_tensor


def wire(obj):
    """What a tensor map looks like after a trip through msgpack."""
    return msgpack.unpackb(p.pack(obj), raw=False)


# ------------------------------------------------------------ tensors
@pytest.mark.parametrize("arr", [
    np.arange(12, dtype=np.float32).reshape(3, 4) / 3,
    np.array([-(2**63), -1, 0, 2**63 - 1], dtype=np.int64),
    np.array([[True, False], [False, True]]),
    np.array(2.5, dtype=np.float32),  # 0-d keeps shape []
    np.zeros((0, 3), dtype=np.float64),  # empty
    np.arange(8, dtype=np.uint8).reshape(2, 2, 2),
    np.array([1.5, -2.25], dtype=np.float16),
], ids=["float32", "int64", "bool", "0-d", "empty", "uint8-3d", "float16"])
def test_tensor_round_trip(arr):
    m = encode_tensor(arr)
    assert m["dtype"] == arr.dtype.name and m["shape"] == list(arr.shape)
    assert isinstance(m["data"], bytes)
    out = decode_tensor(wire(m))
    assert out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)
    assert not out.flags.writeable, "decoded tensors are read-only views over the message"


def test_big_endian_input_is_sent_little_endian():
    arr = np.arange(5, dtype=">f4") * 1.5
    m = encode_tensor(arr)
    assert m["dtype"] == "float32"
    assert m["data"] == (np.arange(5, dtype="<f4") * 1.5).tobytes()
    out = decode_tensor(wire(m))
    assert out.dtype.byteorder in ("<", "=")
    np.testing.assert_array_equal(out, arr)
    big64 = np.array([1, 256, -2], dtype=">i8")
    np.testing.assert_array_equal(decode_tensor(wire(encode_tensor(big64))), big64)


def test_non_contiguous_input_is_encoded_in_logical_order():
    arr = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2].T
    out = decode_tensor(wire(encode_tensor(arr)))
    np.testing.assert_array_equal(out, arr)


def test_decode_0d_tensor():
    out = decode_tensor({"dtype": "int64", "shape": [], "data": np.int64(-7).tobytes()})
    assert out.shape == () and out.item() == -7


def test_encode_0d_keeps_empty_shape():
    assert encode_tensor(np.float32(3.0))["shape"] == []
    assert encode_tensor(np.array(True))["shape"] == []


def test_decode_accepts_bytearray_and_memoryview():
    data = np.arange(4, dtype=np.int32).tobytes()
    for d in (bytearray(data), memoryview(data)):
        out = decode_tensor({"dtype": "int32", "shape": [2, 2], "data": d})
        np.testing.assert_array_equal(out, [[0, 1], [2, 3]])


@settings(max_examples=50, deadline=None)
@given(dtype=st.sampled_from(p.DTYPES), shape=st.lists(st.integers(0, 4), min_size=1, max_size=4),
       seed=st.integers(0, 2**32 - 1))
def test_tensor_round_trip_property(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    arr = raw.view(dt).reshape(shape) if dtype != "bool" else (raw.reshape(shape) & 1).astype(bool)
    out = decode_tensor(wire(encode_tensor(arr)))
    assert out.shape == arr.shape and out.dtype == arr.dtype and out.tobytes() == arr.tobytes()


GOOD = {"dtype": "float32", "shape": [2, 2], "data": b"\0" * 16}


@pytest.mark.parametrize("bad", [
    "not a map",
    {**GOOD, "dtype": "complex64"},
    {**GOOD, "dtype": "object"},
    {**GOOD, "dtype": None},
    {**GOOD, "dtype": "<f4"},  # dtype names only, not numpy codes
    {**GOOD, "shape": [2, 3]},  # 24 bytes needed, 16 given
    {**GOOD, "shape": [4, 4]},
    {**GOOD, "data": b"\0" * 15},
    {**GOOD, "shape": [-2, -2]},  # negative dims (product matches!)
    {**GOOD, "shape": [2, True]},
    {**GOOD, "shape": [2.0, 2]},
    {**GOOD, "shape": (2, 2)},  # not a list
    {**GOOD, "shape": "2,2"},
    {**GOOD, "shape": None},
    {"dtype": "float32", "shape": [1] * 9, "data": b"\0" * 4},  # too many dims
    {**GOOD, "data": "\0" * 16},  # str, not bin
    {**GOOD, "data": [0] * 16},
    {"dtype": "float32", "shape": [2, 2]},  # no data
], ids=lambda v: repr(v)[:40])
def test_decode_tensor_errors(bad):
    with pytest.raises(RequestError) as ei:
        decode_tensor(bad, what="input 'x'")
    assert ei.value.code == INVALID_INPUT
    assert "input 'x'" in ei.value.message


def test_max_dims_allowed():
    out = decode_tensor({"dtype": "int8", "shape": [1] * p.MAX_TENSOR_DIMS, "data": b"\x05"})
    assert out.ndim == p.MAX_TENSOR_DIMS and out.item() == 5


# ------------------------------------------------------------ responses
def test_result_body_splices_outputs():
    outputs = {"label": "90", "scores": encode_tensor(np.array([0.1, 0.9], np.float32)), "n": 3}
    body = p.result_body("req-1", "orientation", "1", p.pack(outputs), {"pre": 10, "infer": 20},
                         extra={"batch": 4})
    got = msgpack.unpackb(body, raw=False)
    assert got == {"id": "req-1", "ok": True, "model": "orientation", "version": "1",
                   "timing_us": {"pre": 10, "infer": 20}, "batch": 4, "outputs": wire(outputs)}
    np.testing.assert_array_equal(decode_tensor(got["outputs"]["scores"]), np.array([0.1, 0.9], np.float32))
    # The spliced body is byte-identical to packing the whole map at once.
    assert body == p.pack({"id": "req-1", "ok": True, "model": "orientation", "version": "1",
                           "timing_us": {"pre": 10, "infer": 20}, "batch": 4, "outputs": outputs})


def test_result_body_without_extra_and_int_id():
    body = p.result_body(2**64 - 1, "m", "2", p.pack({}), {})
    assert msgpack.unpackb(body, raw=False) == {"id": 2**64 - 1, "ok": True, "model": "m", "version": "2",
                                                "timing_us": {}, "outputs": {}}


def test_error_body():
    got = msgpack.unpackb(p.error_body(7, p.TIMEOUT, "too slow"), raw=False)
    assert got == {"id": 7, "ok": False, "error": {"code": "TIMEOUT", "message": "too slow"}}
    assert set(p.ERROR_CODES) >= {p.INVALID_REQUEST, p.INVALID_INPUT, p.MODEL_NOT_FOUND, p.OVERLOADED,
                                  p.TIMEOUT, p.UNAVAILABLE, p.INTERNAL}


# ------------------------------------------------------------ unpacking
def test_unpack_limited_round_trip_and_int_keys():
    obj = {"id": 1, "op": "infer", "inputs": {"x": b"\x00\x01"}, 5: "int key"}
    assert p.unpack_limited(p.pack(obj), 1000) == obj


def test_unpack_limited_rejects_long_str_and_bin():
    assert p.unpack_limited(p.pack("x" * 100), 100) == "x" * 100
    with pytest.raises(ValueError):
        p.unpack_limited(p.pack("x" * 101), 100)
    with pytest.raises(ValueError):
        p.unpack_limited(p.pack({"data": b"\0" * 101}), 100)


def test_unpack_limited_rejects_ext():
    with pytest.raises(ValueError):
        p.unpack_limited(msgpack.packb(msgpack.ExtType(1, b"abc")), 1000)


def test_unpack_limited_rejects_garbage():
    with pytest.raises(Exception):
        p.unpack_limited(b"\xc1", 1000)  # never-used msgpack byte
    with pytest.raises(Exception):
        p.unpack_limited(p.pack({"a": 1})[:-1], 1000)  # truncated


# ------------------------------------------------------------ ids
@pytest.mark.parametrize("value, ok", [
    (0, True), (-1, True), (-(2**63), True), (2**64 - 1, True),
    (2**64, False), (-(2**63) - 1, False),
    ("", True), ("a" * 256, True), ("a" * 257, False), ("é" * 256, True),
    (True, False), (False, False), (1.5, False), (None, False), (b"id", False), ([1], False),
])
def test_valid_id(value, ok):
    assert p.valid_id(value) is ok
