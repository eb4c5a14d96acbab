"""String tensors (``aieng/wire/strings.py``) through every in-process form, and the dtype mapping.

A string tensor is an object array of bytes in a process, a packed blob (4-byte length + bytes per element)
in a shared-memory slot, a ``bytes`` tensor map on the native wire and ``BYTES`` in OIP; ONNX Runtime's
types map to numpy's, and a type with no numpy counterpart (bfloat16) is refused naming it.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng.gateway import codec
from aieng.gpu_executor import sessions
from aieng.wire import shm, strings
from aieng.wire.protocol import RequestError, decode_tensor, dtype_name, encode_tensor, pack, unpack_limited


def obj(items, shape=None) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr.reshape(shape if shape is not None else [len(items)])


@pytest.fixture
def ring():
    inst = str(random.randrange(10**12, 10**13))
    r = shm.Ring.create(shm.segment_name(inst, "pre0", 1), 2, 8192)
    yield r
    r.close()
    r.seg.unlink()
    assert shm.list_segments(inst) == []


def test_pack_unpack_round_trip_keeps_every_byte():
    arr = obj([b"", b"a", b"\x00\xff\x00", "é".encode(), b"x" * 300, b"\x00"], [2, 3])
    blob = strings.pack(arr)
    assert len(blob) == strings.packed_size(arr) == 4 * 6 + 0 + 1 + 3 + 2 + 300 + 1
    buf = np.frombuffer(b"pad" + blob, dtype=np.uint8)
    back = strings.unpack(buf, 3, len(buf), [2, 3])
    assert back.dtype == object and back.shape == (2, 3)
    assert back.tolist() == arr.tolist()


def test_unpack_refuses_a_blob_past_its_end():
    blob = strings.pack(obj([b"abcdef"]))
    with pytest.raises(ValueError, match="runs past"):
        strings.unpack(np.frombuffer(blob, dtype=np.uint8), 0, len(blob) - 1, [1])


def test_str_elements_are_their_utf8_bytes():
    arr = obj(["é", b"b"])
    back = strings.unpack(np.frombuffer(strings.pack(arr), np.uint8), 0, 11, [2])
    assert back.tolist() == ["é".encode(), b"b"]
    assert strings.as_str(arr).tolist() == ["é", "b"]
    assert strings.check_utf8(obj([b"ok", b"\xff"])) == 1 and strings.check_utf8(arr) is None


def test_ring_round_trip_mixes_strings_and_numbers(ring):
    tensors = [("s", obj([b"ab", b"", b"\xc3\xa9"], [3, 1])), ("f", np.arange(4, dtype=np.float32)),
               ("s0", obj([b"zero-d"], [])), ("u64", np.array([2**64 - 1], dtype=np.uint64))]
    slot, gen = ring.alloc(shm.payload_bytes(tensors))
    descs = ring.write(slot, tensors)
    assert [d[1] for d in descs] == ["|O", "<f4", "|O", "<u8"]
    assert all(d[3] % shm.ALIGN == 0 for d in descs)
    views = ring.views(slot, descs)
    for name, arr in tensors:
        assert views[name].shape == arr.shape and views[name].dtype == arr.dtype
        assert views[name].tolist() == arr.tolist()
    assert shm.payload_bytes(tensors[:1]) == 64  # 3 x 4 + 5 bytes, one aligned block


def test_ring_refuses_strings_over_a_slot(ring):
    slot, _ = ring.alloc()
    with pytest.raises(OverflowError):
        ring.write(slot, [("s", obj([b"x" * 9000]))])


@settings(max_examples=40, deadline=None)
@given(items=st.lists(st.binary(max_size=40), min_size=0, max_size=12))
def test_native_map_round_trip_property(items):
    arr = obj(items)
    wire = unpack_limited(pack(encode_tensor(arr)), 1 << 20)
    assert wire["dtype"] == "bytes" and wire["shape"] == [len(items)]
    out = decode_tensor(wire)
    assert out.dtype == object and out.tolist() == items


def test_native_map_takes_numpy_text_arrays_and_str_elements():
    assert encode_tensor(np.array([["a", "é"]]))["data"] == [b"a", "é".encode()]
    assert encode_tensor(np.array([b"x"]))["data"] == [b"x"]
    out = decode_tensor({"dtype": "bytes", "shape": [2], "data": ["é", b"\x00"]})
    assert out.tolist() == ["é".encode(), b"\x00"]


@pytest.mark.parametrize("data, message", [
    (b"ab", "must be a list"),
    ([b"a"], "needs 2 elements, got 1"),
    ([b"a", 3], "element 1 must be bin or str"),
])
def test_native_map_refusals(data, message):
    with pytest.raises(RequestError, match=message):
        decode_tensor({"dtype": "bytes", "shape": [2], "data": data})


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_wider_unsigned_maps_round_trip(dtype):
    arr = np.array([0, 1, np.iinfo(dtype).max], dtype=dtype)
    out = decode_tensor(unpack_limited(pack(encode_tensor(arr)), 1 << 20))
    assert out.dtype == arr.dtype and out.tolist() == arr.tolist()


def test_oip_bytes_tensor_input_and_output():
    kinds = {"t": "tensor"}
    t = codec.from_raw("t", "BYTES", [2, 2], codec.pack_bytes([b"a", b"", b"c", b"\xff"]))
    rows = codec.split_rows(kinds, [t], 4)
    assert [decode_tensor(r["t"]).tolist() for r in rows] == [[b"a", b""], [b"c", b"\xff"]]
    dt, arr = codec.join_rows("o", [obj(["x", "y"]), obj([b"z", b""])])
    assert dt == "BYTES" and arr.shape == (2, 2)
    assert codec.unpack_bytes(codec.raw_of(dt, arr), 4, "o") == [b"x", b"y", b"z", b""]
    assert codec.json_data(dt, arr) == ["x", "y", "z", ""]


@pytest.mark.parametrize("ort_type, want", [
    ("tensor(bool)", "bool"), ("tensor(uint8)", "uint8"), ("tensor(uint16)", "uint16"),
    ("tensor(uint32)", "uint32"), ("tensor(uint64)", "uint64"), ("tensor(int8)", "int8"),
    ("tensor(int16)", "int16"), ("tensor(int32)", "int32"), ("tensor(int64)", "int64"),
    ("tensor(float16)", "float16"), ("tensor(float)", "float32"), ("tensor(double)", "float64"),
    ("tensor(string)", "bytes"),
])
def test_every_ort_type_maps_to_a_wire_dtype_and_an_oip_datatype(ort_type, want):
    dt = sessions.ort_dtype("m:1", "input", "x", ort_type)
    assert dtype_name(dt) == want
    oip = "BYTES" if want == "bytes" else {v: k for k, v in codec.NUMERIC.items()}[want]
    assert codec.BY_DTYPE[want] == oip


@pytest.mark.parametrize("ort_type", ["tensor(bfloat16)", "tensor(float8e4m3fn)"])
def test_types_without_numpy_counterpart_are_refused_by_name(ort_type):
    with pytest.raises(RuntimeError) as info:
        sessions.ort_dtype("m:1", "output", "y", ort_type)
    assert str(info.value).startswith(f"m:1: output y has unsupported type {ort_type}")


def test_string_rows_batch_padded_and_cut_back():
    """Object arrays of the same non-batch shape stack along the batch axis; along a variable axis they pad
    with the empty string and each request gets its own elements back (a real ONNX Runtime run)."""
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", T.STRING, ["batch", "n"])],
                              [helper.make_tensor_value_info("y", T.STRING, ["batch", "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = object.__new__(sessions.ModelSession)
    sess.batched = True  # an open first axis (ModelSession.__init__ reads it from ONNX Runtime)
    sess.inputs = [sessions.InputSpec("x", np.dtype(object), ["n"], 0.0)]
    sess.outputs = [sessions.OutputSpec("y", "bytes", ["n"])]
    per = [{"x": obj([b"a", "\u00e9".encode(), b"c"])}, {"x": obj([b"only"])}, {"x": obj([b"", b"z"])}]
    feeds, sizes = sess.feeds_from(per)
    assert feeds["x"].shape == (3, 3) and feeds["x"].tolist() == [["a", "\u00e9", "c"], ["only", "", ""],
                                                                  ["", "z", ""]]
    run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = run.run(["y"], feeds)
    got = [dict(sess.request_outputs(outs, row, sizes[row]))["y"].tolist() for row in range(3)]
    assert got == [["a", "\u00e9", "c"], ["only"], ["", "z"]]
    fixed = object.__new__(sessions.ModelSession)
    fixed.batched = True
    fixed.inputs = [sessions.InputSpec("x", np.dtype(object), [2], 0.0)]
    stacked, _ = fixed.feeds_from([{"x": obj([b"1", b"2"])}, {"x": obj([b"3", b"4"])}])
    assert stacked["x"].tolist() == [["1", "2"], ["3", "4"]]
