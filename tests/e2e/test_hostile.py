"""Hostile input against the live server (hypothesis): whatever arrives, every
message gets exactly one answer with a known code, and the server stays up.
``AIENG_FUZZ_EXAMPLES`` raises the number of cases for a longer run."""
from __future__ import annotations

import os

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from aieng.protocol import ERROR_CODES

pytestmark = pytest.mark.e2e
N = int(os.environ.get("AIENG_FUZZ_EXAMPLES", "1000"))
CODES = set(ERROR_CODES)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=50), st.binary(max_size=200))
values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                      max_leaves=12)
tensor_maps = st.fixed_dictionaries({
    "dtype": st.sampled_from(["float32", "int64", "uint8", "complex64", "", "float16"]),
    "shape": st.lists(st.integers(-3, 5000), max_size=5),
    "data": st.binary(max_size=64)})
inputs = st.dictionaries(st.sampled_from(["text", "image", "island", "bill_length_mm", "x", ""]),
                         st.one_of(values, tensor_maps, st.binary(min_size=8, max_size=300)), max_size=4)
requests = st.fixed_dictionaries(
    {"model": st.sampled_from(["minilm", "orientation", "tabular", "nope", 7])},
    optional={"id": st.one_of(st.integers(-2 ** 63, 2 ** 64 - 1), st.text(max_size=300), st.floats(), st.none()),
              "op": st.sampled_from(["infer", "health", "bogus", 3]),
              "version": st.one_of(st.just("1"), st.text(max_size=3), st.integers(-9, 9)),
              "inputs": st.one_of(inputs, values),
              "params": st.one_of(st.dictionaries(st.sampled_from(["top_k", "z"]), values, max_size=2), values),
              "timeout_ms": st.one_of(st.integers(-5, 10 ** 7), st.floats(), st.text(max_size=3))})


@pytest.fixture(scope="module")
def sock(server):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server.addr)
    yield s
    s.close(0)


def roundtrip(sock, frame: bytes) -> dict:
    sock.send(frame)
    assert sock.poll(15000), "no answer: the server stalled or dropped a message"
    reply = msgpack.unpackb(sock.recv(), raw=False, strict_map_key=False)
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
    if not reply["ok"]:
        assert reply["error"]["code"] in CODES, reply
    return reply


@settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=2000))
def test_random_bytes(sock, data):
    roundtrip(sock, data)


@settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))
@given(req=requests)
def test_structured_garbage(sock, req):
    roundtrip(sock, msgpack.packb(req, use_bin_type=True))


@pytest.mark.parametrize("frame", [
    msgpack.packb({"model": "minilm", "inputs": {"text": "x" * 1_000_000}}),  # a megabyte of text
    msgpack.packb({"model": "minilm", "inputs": {"text": "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")}}),
    b"\xdd\xff\xff\xff\xff",  # array claiming 4G elements
    b"\xdb\xff\xff\xff\xff" + b"a" * 10,  # str claiming 4 GB
    b"\x91" * 5000 + b"\xc0",  # 5000 nested arrays
    msgpack.packb({"model": "minilm", "inputs": {"text": b"\xff\xfe not utf-8"}}),
    msgpack.packb({"model": "orientation", "inputs": {"image": b"\x89PNG\r\n\x1a\n" + b"\x00" * 8 + b"IHDR"
                                                               + (100000).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00"}}),
    msgpack.packb({"model": "orientation", "inputs": {"image": b"\xff\xd8\xff\xd9"}}),  # empty JPEG
    msgpack.packb({"model": "tabular", "inputs": {"bill_length_mm": float("nan"), "body_mass_g": float("inf")}}),
], ids=["1MB-text", "odd-unicode", "array-4G", "str-4G", "deep-nesting", "text-as-bin", "png-bomb", "empty-jpeg",
        "nan-inf"])
def test_known_nasties(sock, frame):
    roundtrip(sock, frame)


def test_still_healthy_after_fuzzing(sock, server):
    h = roundtrip(sock, msgpack.packb({"op": "health"}))
    assert h["ready"] and all(p["restarts"] == 0 for p in h["processes"].values()), h
