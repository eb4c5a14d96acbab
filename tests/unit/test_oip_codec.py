"""OIP tensors <-> native inputs (aieng/gateway/codec.py) and the metadata built from a ``models`` reply
(aieng/gateway/models.py), without processes; hypothesis for the raw and JSON decoders."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng.gateway import codec, models
from aieng.gateway.http import parse_infer, render, requested_outputs
from aieng.gateway.service import Answer, timeout_ms_of
from aieng.models.sections import Batching
from aieng.wire.protocol import INVALID_INPUT, INVALID_REQUEST, RequestError, decode_tensor

NUMERIC = [k for k in codec.NUMERIC if k != "FP16"]


def test_bytes_elements_round_trip_and_refuse_bad_lengths():
    items = [b"", b"a", "é".encode(), b"\0" * 300]
    raw = codec.pack_bytes(items)
    assert codec.unpack_bytes(raw, 4, "x") == items
    for bad, count in ((raw[:-1], 4), (raw + b"\0", 4), (raw, 5), (b"\1\0\0", 1)):
        with pytest.raises(RequestError) as info:
            codec.unpack_bytes(bad, count, "x")
        assert info.value.code == INVALID_INPUT


@settings(max_examples=200, deadline=None)
@given(dt=st.sampled_from(NUMERIC), shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       seed=st.integers(0, 2 ** 31))
def test_raw_round_trip(dt, shape, seed):
    rng = np.random.default_rng(seed)
    arr = (rng.random(shape) * 100).astype(codec.NUMERIC[dt])
    t = codec.from_raw("x", dt, list(shape), codec.raw_of(dt, arr))
    np.testing.assert_array_equal(t.array(), arr)
    j = codec.from_json("x", dt, list(shape), json.loads(json.dumps(codec.json_data(dt, arr))))
    np.testing.assert_array_equal(j.array(), arr)


@settings(max_examples=300, deadline=None)
@given(dt=st.text(max_size=6) | st.sampled_from(codec.DATATYPES),
       shape=st.lists(st.integers(-3, 2 ** 33), max_size=10), raw=st.binary(max_size=64))
def test_raw_decoder_answers_or_refuses_with_a_code(dt, shape, raw):
    try:
        t = codec.from_raw("x", dt, shape, raw)
    except RequestError as exc:
        assert exc.code in (INVALID_INPUT, INVALID_REQUEST)
        return
    assert t.array().shape == tuple(shape)


def test_json_element_types_are_checked_not_coerced():
    for dt, data in (("FP32", ["1.5"]), ("INT64", [1.5]), ("INT64", [True]), ("BOOL", [1]), ("BYTES", [3]),
                     ("INT8", [300])):
        with pytest.raises(RequestError):
            codec.from_json("x", dt, [1], data)
    assert codec.from_json("x", "FP32", [2, 1], [[1], [2.5]]).array().tolist() == [[1.0], [2.5]]


KINDS = {"text": "text", "n": "number", "c": "category", "img": "image", "t": "tensor"}


def test_split_rows_by_kind():
    tensors = [codec.Tensor("text", "BYTES", [2], [b"hi", "é".encode()]),
               codec.Tensor("n", "FP32", [2, 1], np.array([1.5, np.nan], dtype=np.float32)),
               codec.Tensor("c", "BYTES", [2], [b"a", b""]),
               codec.Tensor("img", "BYTES", [2], [b"\x89PNG", b"\xff\xd8"]),
               codec.Tensor("t", "INT64", [2, 3], np.arange(6, dtype=np.int64))]
    rows = codec.split_rows(KINDS, tensors, 4)
    assert [r["text"] for r in rows] == ["hi", "é"]
    assert [r["n"] for r in rows] == [1.5, None]
    assert [r["img"] for r in rows] == [b"\x89PNG", b"\xff\xd8"]
    assert decode_tensor(rows[1]["t"]).tolist() == [3, 4, 5]


@pytest.mark.parametrize("tensors, message", [
    ([codec.Tensor("text", "FP32", [1], np.zeros(1, np.float32))], "datatype must be BYTES"),
    ([codec.Tensor("text", "BYTES", [1, 2], [b"a", b"b"])], "shape must be [N] or [N, 1]"),
    ([codec.Tensor("n", "BYTES", [1], [b"1"])], "numeric datatype"),
    ([codec.Tensor("text", "BYTES", [5], [b"a"] * 5)], "1..4 rows"),
    ([codec.Tensor("text", "BYTES", [1], [b"\xff"])], "not valid UTF-8"),
    ([codec.Tensor("zz", "BYTES", [1], [b"a"])], "has no input 'zz'"),
    ([codec.Tensor("text", "BYTES", [1], [b"a"]), codec.Tensor("c", "BYTES", [2], [b"a", b"b"])],
     "disagree on the number of rows"),
])
def test_split_rows_refuses(tensors, message):
    with pytest.raises(RequestError) as info:
        codec.split_rows(KINDS, tensors, 4)
    assert message in info.value.message


def test_join_rows():
    assert codec.join_rows("e", [np.ones(3, np.float32)] * 2)[1].shape == (2, 3)
    dt, arr = codec.join_rows("label", ["a", "b"])
    assert dt == "BYTES" and list(arr) == [b"a", b"b"]
    assert codec.join_rows("s", [1, 2.5])[0] == "FP64"


PUB = {"version": "1", "inputs": [{"name": "text", "kind": "text"}],
       "outputs": [{"name": "embedding", "kind": "tensor", "dtype": "float32", "shape": [384]},
                   {"name": "label", "kind": "str"}],
       "max_batch_size": 32, "timeout_ms": 1000, "onnx": None, "load_error": None}


def test_metadata_and_config_shapes():
    view = models.build_view("m", PUB, Batching(max_wait_ms=5))
    meta = models.metadata(view)
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"][0] == {"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}
    cfg = models.config(view)
    assert cfg["max_batch_size"] == 32 and cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
    assert cfg["input"][0]["dims"] == [1] and cfg["output"][0]["dims"] == [384]
    tensor_pub = dict(PUB, inputs=[{"name": "x", "kind": "tensor"}],
                      onnx={"inputs": [{"name": "x", "dtype": "int64", "shape": ["batch", "seq", 3]}]})
    assert models.build_view("m", tensor_pub, None).inputs[0]["shape"] == [-1, -1, 3]


def test_http_binary_request_and_response():
    head = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 6}}],
                       "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}]}).encode()
    body = head + codec.pack_bytes([b"hi"])
    req, tensors = parse_infer(body, {"inference-header-content-length": str(len(head))})
    assert tensors[0].data == [b"hi"]
    names, binary = requested_outputs(req)
    view = models.build_view("m", PUB, None)
    emb = np.arange(4, dtype=np.float32).reshape(1, 4)
    status, headers, out = render(Answer(view, [("embedding", "FP32", emb)]), "r1", binary)
    n = int(headers["Inference-Header-Content-Length"])
    assert json.loads(out[:n])["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert np.frombuffer(out[n:], "<f4").tolist() == [0, 1, 2, 3]


def test_timeout_parameter():
    assert timeout_ms_of({}) is None
    assert timeout_ms_of({"timeout": 1500}) == 2
    assert timeout_ms_of({"timeout": 10 ** 9}, deadline_s=0.25) == 250
    with pytest.raises(RequestError):
        timeout_ms_of({"timeout": "soon"})


def test_a_model_that_does_not_batch_has_no_batch_dimension():
    pub = dict(PUB, max_batch_size=1,
               inputs=[{"name": "x", "kind": "tensor"}, {"name": "n", "kind": "number"}],
               outputs=[{"name": "y", "kind": "tensor"}],
               onnx={"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 2, 3]}],
                     "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 3, 2]}]})
    view = models.build_view("t", pub, None)
    assert [i["shape"] for i in view.inputs] == [[2, 3], [1]] and view.outputs[0]["shape"] == [3, 2]
    cfg = models.config(view)
    assert cfg["max_batch_size"] == 0 and cfg["input"][0]["dims"] == [2, 3]
    x = codec.Tensor("x", "FP32", [2, 3], np.arange(6, dtype=np.float32))
    (row,) = codec.split_rows(view.kinds, [x, codec.Tensor("n", "FP64", [1], np.array([2.0]))], 1, False)
    assert decode_tensor(row["x"]).shape == (2, 3) and row["n"] == 2.0
    with pytest.raises(RequestError):
        codec.split_rows(view.kinds, [codec.Tensor("n", "FP64", [2], np.zeros(2))], 1, False)


@pytest.mark.parametrize("value", ["\u00b2", "-1", "1e3", "99999"])
def test_a_bad_inference_header_length_is_a_clear_invalid_request(value):
    body = b'{"inputs": []}'
    with pytest.raises(RequestError) as err:
        parse_infer(body, {"inference-header-content-length": value})
    assert err.value.code == INVALID_REQUEST and "Inference-Header-Content-Length" in err.value.message
