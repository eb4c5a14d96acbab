"""The client contract over real sockets: REQ and DEALER clients, the health
and models ops, and every kind of bad input answered with its error code while
the server keeps serving everyone else."""
from __future__ import annotations

import os
import shutil

import msgpack
import numpy as np
import pytest
import zmq

from aieng.client import decode_reply
from aieng.wire.protocol import encode_tensor
from tests.conftest import MODELS, ServerProcess, save_tensor_model

pytestmark = pytest.mark.e2e


def raw_call(addr: str, frame: bytes, sock_type=zmq.DEALER, timeout_ms: int = 10000) -> dict:
    ctx = zmq.Context.instance()
    s = ctx.socket(sock_type)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    try:
        s.send(frame)
        assert s.poll(timeout_ms), "no reply: a request went unanswered"
        return decode_reply(s.recv_multipart()[-1])
    finally:
        s.close(0)


def raw_reply(addr: str, frame: bytes, timeout_ms: int = 10000) -> dict:
    """The reply exactly as sent: msgpack only, tensor maps left as {dtype, shape, data}."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    try:
        s.send(frame)
        assert s.poll(timeout_ms), "no reply: a request went unanswered"
        return msgpack.unpackb(s.recv(), raw=False, strict_map_key=False)
    finally:
        s.close(0)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def transpose_model(repo) -> None:
    """x[batch, 2, 3] -> y[batch, 3, 2], each request's matrix transposed: a 2-D output whose
    C-order bytes differ from its Fortran-order bytes, passed through as a tensor map."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], "transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 2])])
    save_tensor_model(repo, "transpose", graph)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """tabular and the transpose model, with a 64 KiB message limit (one start for both tests)."""
    tmp = tmp_path_factory.mktemp("small")
    repo = tmp / "repo"
    repo.mkdir()
    transpose_model(repo)
    shutil.copytree(os.path.join(MODELS, "tabular"), repo / "tabular")
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(repo), AIENG_MAX_MESSAGE_BYTES="65536").start()
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def test_req_socket_client(server):
    reply = raw_call(server.addr, pack({"id": "r1", "model": "minilm", "inputs": {"text": "hello"}}), zmq.REQ)
    assert reply["ok"] and reply["id"] == "r1" and reply["model"] == "minilm" and reply["version"] == "1"
    assert reply["outputs"]["embedding"].shape == (384,)
    assert set(reply["timing_us"]) >= {"preprocess", "inference", "postprocess", "total"}


def test_dealer_many_in_flight_replies_matched_by_id(server):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server.addr)
    try:
        n = 40
        for i in range(n):  # single-frame messages, all sent before reading any reply
            model = ("minilm", "tabular")[i % 2]
            inputs = {"text": f"request number {i}"} if model == "minilm" else {"island": "Dream"}
            s.send(pack({"id": i, "model": model, "inputs": inputs}))
        seen = set()
        while len(seen) < n:
            assert s.poll(20000), f"missing replies for {set(range(n)) - seen}"
            reply = decode_reply(s.recv())
            assert reply["ok"], reply
            assert reply["id"] not in seen
            seen.add(reply["id"])
    finally:
        s.close(0)


def test_health_and_models(server):
    h = raw_call(server.addr, pack({"op": "health", "id": 1}))
    assert h["ok"] and h["live"] and h["ready"] and h["protocol"] == 1
    assert set(h["providers"].values()) <= {"CPUExecutionProvider", "CUDAExecutionProvider"}
    assert h["workers"] == {"preprocess": 2, "executor": 1, "postprocess": 1}
    m = raw_call(server.addr, pack({"op": "models"}))
    assert set(m["models"]) == {"minilm", "orientation", "tabular", "layout", "textdet", "textrec", "ocr"}
    assert m["models"]["ocr"]["versions"]["1"]["kind"] == "pipeline"
    v = m["models"]["minilm"]["versions"]["1"]
    assert len(v["hash"]) == 64 and v["inputs"] == [{"name": "text", "kind": "text"}]
    assert v["onnx"]["inputs"][0]["name"] == "input_ids"


BAD = [
    (b"\xc1\xc1\xc1", "INVALID_REQUEST"),  # not msgpack
    (pack([1, 2, 3]), "INVALID_REQUEST"),  # not a map
    (pack("just a string"), "INVALID_REQUEST"),
    (pack({"id": 1, "inputs": {"text": "x"}}), "INVALID_REQUEST"),  # no model
    (pack({"id": 1, "model": "nope", "inputs": {"text": "x"}}), "MODEL_NOT_FOUND"),
    (pack({"id": 1, "model": "minilm", "version": "9", "inputs": {"text": "x"}}), "MODEL_NOT_FOUND"),
    (pack({"id": 1, "model": "minilm"}), "INVALID_REQUEST"),  # no inputs
    (pack({"id": 1, "model": "minilm", "inputs": {"text": 5}}), "INVALID_INPUT"),  # wrong type
    (pack({"id": 1, "model": "minilm", "inputs": {"text": ""}}), "INVALID_INPUT"),  # empty text
    (pack({"id": 1, "model": "minilm", "inputs": {"txt": "hi"}}), "INVALID_INPUT"),  # unknown input
    (pack({"id": 1, "model": "minilm", "inputs": {}}), "INVALID_INPUT"),  # missing input
    (pack({"id": 1, "model": "orientation", "inputs": {"image": b"not an image at all"}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "orientation", "inputs": {"image": b"\x89PNG\r\n\x1a\n" + b"\0" * 40}}),
     "INVALID_INPUT"),
    (pack({"id": 1, "model": "orientation", "inputs": {"image": "a string"}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "tabular", "inputs": {"island": 3}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "tabular", "inputs": {"bill_length_mm": "long"}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "minilm", "inputs": {"text": "x"}, "timeout_ms": -5}), "INVALID_REQUEST"),
    (pack({"id": 1, "model": "minilm", "inputs": {"text": "x"}, "params": [1]}), "INVALID_REQUEST"),
    (pack({"id": 1.5, "model": "minilm", "inputs": {"text": "x"}}), "INVALID_REQUEST"),
    (pack({"op": "explode"}), "INVALID_REQUEST"),
    (pack({"id": 1, "model": "tabular", "inputs": {"island": "Dream"}, "params": {"top_k": "x"}}),
     "INVALID_INPUT"),
]


@pytest.mark.parametrize("frame,code", BAD, ids=[f"{i}-{c}" for i, (_, c) in enumerate(BAD)])
def test_bad_input_gets_its_code(server, frame, code):
    reply = raw_call(server.addr, frame)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code, reply
    assert reply["error"]["message"]


def test_message_over_size_limit(small_server):
    srv = small_server
    big = pack({"id": 1, "model": "tabular", "inputs": {"island": "x" * 100_000}})
    reply = raw_call(srv.addr, big)
    assert reply["error"]["code"] == "INVALID_REQUEST" and "limit" in reply["error"]["message"]
    ok = raw_call(srv.addr, pack({"id": 2, "model": "tabular", "inputs": {"island": "Dream"}}))
    assert ok["ok"]


def test_server_keeps_serving_after_bad_input(server):
    for frame, _ in BAD:
        raw_call(server.addr, frame)
    reply = raw_call(server.addr, pack({"id": "after", "model": "minilm", "inputs": {"text": "still here"}}))
    assert reply["ok"] and reply["id"] == "after"
    h = raw_call(server.addr, pack({"op": "health"}))
    assert h["ready"] and all(p["restarts"] == 0 for p in h["processes"].values())


def test_tensor_map_outputs_are_little_endian_c_order(server):
    # Read the tensor maps as the server sent them: the client's decoder reinterprets any bytes
    # as little endian of the dtype named, so a check after it could not see a wrong wire form.
    reply = raw_reply(server.addr, pack({"id": 1, "model": "tabular", "inputs": {"island": "Biscoe"},
                                         "params": {"top_k": 2}}))
    assert reply["ok"] and reply["id"] == 1, reply
    probs = reply["outputs"]["probabilities"]
    assert probs["dtype"] == "float32" and probs["shape"] == [3], probs
    assert isinstance(probs["data"], bytes) and len(probs["data"]) == 3 * 4
    values = np.frombuffer(probs["data"], dtype="<f4")  # protocol: little endian on the wire
    assert abs(float(values.sum()) - 1.0) < 1e-4 and values.min() >= 0.0, values
    assert len(reply["outputs"]["top_k"]) == 2
    emb = raw_reply(server.addr, pack({"id": 2, "model": "minilm", "inputs": {"text": "byte order"}}))
    emb = emb["outputs"]["embedding"]
    assert emb["dtype"] == "float32" and emb["shape"] == [384] and len(emb["data"]) == 384 * 4, emb["shape"]
    assert abs(float(np.linalg.norm(np.frombuffer(emb["data"], dtype="<f4"))) - 1.0) < 1e-3  # normalised


def test_tensor_map_2d_output_is_c_order_on_the_wire(small_server):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    frame = pack({"id": "t", "model": "transpose", "inputs": {"x": encode_tensor(x)}})
    reply = raw_reply(small_server.addr, frame)
    assert reply["ok"] and reply["id"] == "t", reply
    y = reply["outputs"]["y"]
    assert y["dtype"] == "float32" and y["shape"] == [3, 2], y
    # row-major little-endian bytes of x.T: 0 3 1 4 2 5 (Fortran order would read 0 1 2 3 4 5)
    assert y["data"] == np.ascontiguousarray(x.T).astype("<f4").tobytes(), np.frombuffer(y["data"], "<f4")


def test_timeout_is_answered(server):
    texts = " ".join(["word"] * 120)
    reply = raw_call(server.addr,
                     pack({"id": "t", "model": "minilm", "inputs": {"text": texts}, "timeout_ms": 1}))
    assert reply["id"] == "t"
    assert reply["ok"] is False and reply["error"]["code"] == "TIMEOUT"  # a 128-token run alone takes > 1 ms
    again = raw_call(server.addr, pack({"id": "u", "model": "minilm", "inputs": {"text": texts}}))
    assert again["ok"]
