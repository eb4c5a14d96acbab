"""The client contract over real sockets: REQ and DEALER clients, the health
and models ops, and every kind of bad input answered with its error code while
the server keeps serving everyone else."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from aieng.client import decode_reply

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


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


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
    assert set(m["models"]) == {"minilm", "orientation", "tabular"}
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
    (pack({"id": 1, "model": "orientation", "inputs": {"image": b"\x89PNG\r\n\x1a\n" + b"\0" * 40}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "orientation", "inputs": {"image": "a string"}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "tabular", "inputs": {"island": 3}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "tabular", "inputs": {"bill_length_mm": "long"}}), "INVALID_INPUT"),
    (pack({"id": 1, "model": "minilm", "inputs": {"text": "x"}, "timeout_ms": -5}), "INVALID_REQUEST"),
    (pack({"id": 1, "model": "minilm", "inputs": {"text": "x"}, "params": [1]}), "INVALID_REQUEST"),
    (pack({"id": 1.5, "model": "minilm", "inputs": {"text": "x"}}), "INVALID_REQUEST"),
    (pack({"op": "explode"}), "INVALID_REQUEST"),
    (pack({"id": 1, "model": "tabular", "inputs": {"island": "Dream"}, "params": {"top_k": "x"}}), "INVALID_INPUT"),
]


@pytest.mark.parametrize("frame,code", BAD, ids=[f"{i}-{c}" for i, (_, c) in enumerate(BAD)])
def test_bad_input_gets_its_code(server, frame, code):
    reply = raw_call(server.addr, frame)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code, reply
    assert reply["error"]["message"]


def test_message_over_size_limit(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_MAX_MESSAGE_BYTES="65536").start()
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
    reply = raw_call(server.addr, pack({"id": 1, "model": "tabular", "inputs": {"island": "Biscoe"},
                                        "params": {"top_k": 2}}))
    probs = reply["outputs"]["probabilities"]
    assert probs.dtype == np.dtype("<f4") and probs.shape == (3,)
    assert abs(float(probs.sum()) - 1.0) < 1e-4
    assert len(reply["outputs"]["top_k"]) == 2


def test_timeout_is_answered(server):
    texts = " ".join(["word"] * 120)
    reply = raw_call(server.addr, pack({"id": "t", "model": "minilm", "inputs": {"text": texts}, "timeout_ms": 1}))
    assert reply["id"] == "t"
    assert reply["ok"] is False and reply["error"]["code"] == "TIMEOUT"  # a 128-token run alone takes > 1 ms
    again = raw_call(server.addr, pack({"id": "u", "model": "minilm", "inputs": {"text": texts}}))
    assert again["ok"]
