"""Bad input at the OIP front door: each gets its status code, and nothing else is affected.

Raw HTTP over a socket (no client library smoothing things over): malformed JSON, a header length
beyond the body, binary sizes that disagree with shape and datatype, unknown datatypes, an oversized
body, slow and half-open connections.  Then hypothesis draws request bodies (HTTP) and request
messages (gRPC, built with tritonclient's own compiled protos, plus raw undecodable bytes) and checks
that every one gets exactly one answer with an expected status and the gateway keeps serving.
``AIENG_FUZZ_EXAMPLES`` raises the number of cases."""
from __future__ import annotations

import http.client
import json
import os
import socket
import struct

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

pytestmark = pytest.mark.e2e
N = max(50, int(os.environ.get("AIENG_FUZZ_EXAMPLES", "1000")) // 5)


def post(addr: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def infer_body(inputs: list, binary: bytes = b"") -> tuple[bytes, dict]:
    head = json.dumps({"inputs": inputs}).encode()
    if not binary:
        return head, {}
    return head + binary, {"Inference-Header-Content-Length": str(len(head))}


def bytes_elems(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def test_bad_bodies_get_400_and_the_door_stays_open(server):
    a = server.oip_http
    path = "/v2/models/minilm/infer"
    assert post(a, path, b"{not json")[0] == 400
    assert post(a, path, b'{"inputs": 3}')[0] == 400
    body, hdr = infer_body([{"name": "text", "datatype": "BYTES", "shape": [1],
                             "parameters": {"binary_data_size": 9}}], bytes_elems(b"hello"))
    assert post(a, path, body, {"Inference-Header-Content-Length": str(len(body) + 1)})[0] == 400  # beyond
    assert post(a, path, body, hdr)[0] == 200  # the same body with the right header length works
    short = bytes_elems(b"hello")[:-1]  # one element announced, its bytes cut short
    body, hdr = infer_body([{"name": "text", "datatype": "BYTES", "shape": [1],
                             "parameters": {"binary_data_size": len(short)}}], short)
    assert post(a, path, body, hdr)[0] == 400
    body, hdr = infer_body([{"name": "bill_length_mm", "datatype": "FP32", "shape": [2],
                             "parameters": {"binary_data_size": 4}}], b"\0" * 4)  # 2 x FP32 is 8 bytes
    assert post(a, "/v2/models/tabular/infer", body, hdr)[0] == 400
    body, hdr = infer_body([{"name": "text", "datatype": "BYTES", "shape": [1],
                             "parameters": {"binary_data_size": 9}}], bytes_elems(b"hello") + b"extra")
    assert post(a, path, body, hdr)[0] == 400  # bytes nobody claimed
    status, reply = post(a, path, json.dumps({"inputs": [{"name": "text", "datatype": "STRING", "shape": [1],
                                                          "data": ["x"]}]}).encode())
    assert status == 400 and "unsupported datatype" in json.loads(reply)["error"]
    status, reply = post(a, path, json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                                          "data": ["x"]}]}).encode())
    assert status == 400 and "needs 2 elements" in json.loads(reply)["error"]
    ok, _ = post(a, path, json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                                  "data": ["still fine"]}]}).encode())
    assert ok == 200


def raw_exchange(addr: str, data: bytes, wait_s: float = 10.0) -> bytes:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return out
            if not chunk:
                return out
            out += chunk


def test_oversized_body_is_413_before_it_is_read(server):
    too_big = 32 * 1024 * 1024 + 1  # the session server's AIENG_MAX_MESSAGE_BYTES, plus one
    reply = raw_exchange(server.oip_http, (f"POST /v2/models/minilm/infer HTTP/1.1\r\nHost: x\r\n"
                                           f"Content-Length: {too_big}\r\n\r\n").encode())
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:80]
    assert b"over the limit" in reply


def test_slow_and_half_open_connections_are_closed(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_HTTP_TIMEOUT_S="0.5", AIENG_PREPROCESS_WORKERS="1",
                      AIENG_MAX_MESSAGE_BYTES="65536").start()
    a = srv.oip_http
    slow_head = raw_exchange(a, b"POST /v2/models/tabular/infer HTTP/1.1\r\nHost: x\r\n")  # never finished
    assert slow_head.startswith(b"HTTP/1.1 408 "), slow_head[:80]
    slow_body = raw_exchange(a, b"POST /v2/models/tabular/infer HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
    assert slow_body.startswith(b"HTTP/1.1 408 "), slow_body[:80]
    idle = raw_exchange(a, b"", wait_s=20)  # connects and says nothing: closed after 12 x 0.5 s
    assert idle == b""
    chunked = raw_exchange(a, b"POST /v2/models/tabular/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"5\r\n{")
    assert chunked.startswith(b"HTTP/1.1 408 ")  # a chunked body that stops coming, like a slow one
    huge_head = raw_exchange(a, b"GET /v2 HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n")
    assert huge_head.startswith(b"HTTP/1.1 431 ")
    body, hdr = infer_body([{"name": "island", "datatype": "BYTES", "shape": [1], "data": ["x" * 70000]}])
    assert post(a, "/v2/models/tabular/infer", body, hdr)[0] == 413
    with grpc.insecure_channel(srv.oip_grpc) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        big = pb.ModelInferRequest(model_name="tabular", raw_input_contents=[b"\0" * 70000])
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(big, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    ok, _ = post(a, "/v2/models/tabular/infer", json.dumps(
        {"inputs": [{"name": "bill_length_mm", "datatype": "FP32", "shape": [1], "data": [40.0]}]}).encode())
    assert ok == 200


# -- fuzzing ----------------------------------------------------------------------------------------
DATATYPES = ["BYTES", "FP32", "FP64", "INT64", "INT8", "BOOL", "FP16", "BF16", "STRING", "", 7]
json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                                     st.floats(allow_nan=False), st.text(max_size=12)),
                           lambda kids: st.lists(kids, max_size=4), max_leaves=10)
oip_inputs = st.fixed_dictionaries(
    {"name": st.sampled_from(["text", "bill_length_mm", "island", "image", "x", ""]),
     "datatype": st.sampled_from(DATATYPES),
     "shape": st.one_of(st.lists(st.integers(-2, 40), max_size=3), json_values)},
    optional={"data": json_values,
              "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-2, 64)})})
bodies = st.fixed_dictionaries({"inputs": st.lists(oip_inputs, max_size=3)},
                               optional={"outputs": st.lists(st.fixed_dictionaries(
                                   {"name": st.sampled_from(["embedding", "label", "zz"])}), max_size=2),
                                         "parameters": st.dictionaries(st.sampled_from(
                                             ["timeout", "binary_data_output", "top_k"]), json_values,
                                             max_size=2)})


@settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["minilm", "tabular", "nope"]), body=bodies, binary=st.binary(max_size=64),
       header_len=st.one_of(st.none(), st.integers(-1, 400)))
def test_fuzz_http_bodies(server, model, body, binary, header_len):
    raw = json.dumps(body).encode()
    headers = {}
    if header_len is not None:
        headers["Inference-Header-Content-Length"] = str(header_len)
        raw += binary
    status, reply = post(server.oip_http, f"/v2/models/{model}/infer", raw, headers)
    assert status in (200, 400, 404, 504), (status, reply[:200])
    if status != 200:
        assert isinstance(json.loads(reply)["error"], str)


grpc_tensors = st.builds(
    lambda name, dt, shape, n: pb.ModelInferRequest.InferInputTensor(name=name, datatype=dt, shape=shape),
    st.sampled_from(["text", "bill_length_mm", "island", "x"]), st.sampled_from([d for d in DATATYPES
                                                                                 if isinstance(d, str)]),
    st.lists(st.integers(-2, 2 ** 40), max_size=3), st.just(0))


@settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["minilm", "tabular", "nope", ""]), tensors=st.lists(grpc_tensors, max_size=3),
       raw=st.lists(st.binary(max_size=40), max_size=3), garbage=st.binary(max_size=80))
def test_fuzz_grpc_messages(server, model, tensors, raw, garbage):
    with grpc.insecure_channel(server.oip_grpc) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name=model, inputs=tensors, raw_input_contents=raw)
        try:
            stub.ModelInfer(req, timeout=30)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.DEADLINE_EXCEEDED), code
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(garbage, timeout=30)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
        # bytes that do not parse as the message are INVALID_ARGUMENT; any that do are a request
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.DEADLINE_EXCEEDED), code


def test_still_serving_after_the_fuzz(server):
    status, reply = post(server.oip_http, "/v2/models/minilm/infer", json.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["after"]}]}).encode())
    assert status == 200
    assert np.array(json.loads(reply)["outputs"][0]["data"]).shape == (384,)
