"""Hostile input against the live server (hypothesis): whatever arrives, every
message gets exactly one answer with a known code, and the server stays up.

Every message goes out on one DEALER socket and is matched to its answer by id
(docs/protocol.md): a message the server can read as a map with a valid ``id``
is answered with that id, anything else (over the size limit, not msgpack, not a
map, an invalid or absent id) with id nil.  Valid ids are made unique per
message.  A ledger counts the messages sent and the answers received per id: an
id answered more often than it was sent fails at once, and the last test drains
the socket and checks that every id got exactly as many answers as messages.
``AIENG_FUZZ_EXAMPLES`` raises the number of cases for a longer run."""
from __future__ import annotations

import itertools
import os
from collections import Counter
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aieng.config import Config
from aieng.wire.protocol import ERROR_CODES, unpack_limited, valid_id

pytestmark = pytest.mark.e2e
N = int(os.environ.get("AIENG_FUZZ_EXAMPLES", "1000"))
CODES = set(ERROR_CODES)
MAX_BYTES = Config().max_message_bytes  # the session server runs with the default limit
QUIET_MS = 1000  # after the last answer: how long no stray (duplicate) answer may arrive

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=50), st.binary(max_size=200))
values = st.recursive(scalars,
                      lambda kids: st.one_of(st.lists(kids, max_size=4),
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
    optional={"id": st.one_of(st.integers(-2 ** 63, 2 ** 64 - 1), st.text(max_size=300), st.floats(),
                              st.none()),
              "op": st.sampled_from(["infer", "health", "bogus", 3]),
              "version": st.one_of(st.just("1"), st.text(max_size=3), st.integers(-9, 9)),
              "inputs": st.one_of(inputs, values),
              "params": st.one_of(st.dictionaries(st.sampled_from(["top_k", "z"]), values, max_size=2),
                                  values),
              "timeout_ms": st.one_of(st.integers(-5, 10 ** 7), st.floats(), st.text(max_size=3))})


def expected_id(frame: bytes) -> Any:
    """The id the answer to ``frame`` must carry: its own if the server can read one, else None."""
    if len(frame) > MAX_BYTES:
        return None
    try:
        req = unpack_limited(frame, MAX_BYTES)
    except Exception:
        return None
    return req["id"] if isinstance(req, dict) and valid_id(req.get("id")) else None


class Ledger:
    """One DEALER socket, the ids sent on it and the answers received, counted per id."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.sent: Counter = Counter()
        self.answered: Counter = Counter()
        self.serial = itertools.count(1)

    def unique(self, drawn: Any) -> Any:
        """A valid id made unique (same type, the drawn text kept); an invalid one as drawn."""
        if not valid_id(drawn):
            return drawn
        n = next(self.serial)
        return n if isinstance(drawn, int) else f"{drawn[:200]}~{n}"

    def receive(self) -> dict:
        reply = msgpack.unpackb(self.sock.recv(), raw=False, strict_map_key=False)
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
        if not reply["ok"]:
            assert reply["error"]["code"] in CODES, reply
        rid = reply.get("id")
        assert rid is None or valid_id(rid), reply
        self.answered[rid] += 1
        assert self.answered[rid] <= self.sent[rid], (
            f"id {rid!r} answered {self.answered[rid]} times for {self.sent[rid]} messages: {reply}")
        return reply

    def roundtrip(self, frame: bytes) -> dict:
        """Send ``frame``; return its answer (the one that completes the count of its id)."""
        rid = expected_id(frame)
        self.sent[rid] += 1
        self.sock.send(frame)
        while True:
            assert self.sock.poll(15000), f"no answer for id {rid!r}: the server stalled or dropped a message"
            reply = self.receive()
            if reply.get("id") == rid and self.answered[rid] == self.sent[rid]:
                break
        while self.sock.poll(0):  # every message sent so far is answered: anything more is extra
            self.receive()
        return reply


@pytest.fixture(scope="module")
def ledger(server):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server.addr)
    yield Ledger(s)
    s.close(0)


@settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=2000))
def test_random_bytes(ledger, data):
    ledger.roundtrip(data)


@settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))
@given(req=requests)
def test_structured_garbage(ledger, req):
    if "id" in req:
        req = dict(req, id=ledger.unique(req["id"]))
    reply = ledger.roundtrip(msgpack.packb(req, use_bin_type=True))
    assert reply.get("id") == (req.get("id") if valid_id(req.get("id")) else None), (req, reply)


def with_id(name: str, obj: dict) -> bytes:
    return msgpack.packb(dict(obj, id=name))


@pytest.mark.parametrize("frame", [
    with_id("1MB-text", {"model": "minilm", "inputs": {"text": "x" * 1_000_000}}),  # a megabyte of text
    with_id("odd-unicode", {"model": "minilm", "inputs": {
        "text": "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")}}),
    b"\xdd\xff\xff\xff\xff",  # array claiming 4G elements
    b"\xdb\xff\xff\xff\xff" + b"a" * 10,  # str claiming 4 GB
    b"\x91" * 5000 + b"\xc0",  # 5000 nested arrays
    with_id("text-as-bin", {"model": "minilm", "inputs": {"text": b"\xff\xfe not utf-8"}}),
    with_id("png-bomb", {"model": "orientation", "inputs": {
        "image": b"\x89PNG\r\n\x1a\n" + b"\x00" * 8 + b"IHDR" + (100000).to_bytes(4, "big") * 2
                 + b"\x08\x02\x00\x00\x00"}}),
    with_id("empty-jpeg", {"model": "orientation", "inputs": {"image": b"\xff\xd8\xff\xd9"}}),
    with_id("nan-inf", {"model": "tabular",
                        "inputs": {"bill_length_mm": float("nan"), "body_mass_g": float("inf")}}),
    with_id("a" * 256, {"op": "health"}),  # the longest valid id
    with_id("b" * 257, {"op": "health"}),  # one char too long: answered with id nil
    with_id(2 ** 64 - 1, {"op": "health"}),
    with_id(-(2 ** 63), {"op": "health"}),
    with_id(1.5, {"op": "health"}),  # a float id: answered with id nil
], ids=["1MB-text", "odd-unicode", "array-4G", "str-4G", "deep-nesting", "text-as-bin", "png-bomb",
        "empty-jpeg", "nan-inf", "id-256-chars", "id-257-chars", "id-max-uint64", "id-min-int64", "id-float"])
def test_known_nasties(ledger, frame):
    reply = ledger.roundtrip(frame)
    assert reply.get("id") == expected_id(frame)


def test_still_healthy_after_fuzzing(ledger):
    h = ledger.roundtrip(msgpack.packb({"op": "health", "id": "health-after-fuzzing"}))
    assert h["id"] == "health-after-fuzzing"
    assert h["ready"] and all(p["restarts"] == 0 for p in h["processes"].values()), h


def test_every_message_answered_exactly_once(ledger):
    """Runs last: a duplicate answer arriving after its id's roundtrip shows up here."""
    while ledger.sock.poll(QUIET_MS):
        ledger.receive()  # fails on an id answered more often than sent
    missing = {rid: n - ledger.answered[rid] for rid, n in ledger.sent.items() if ledger.answered[rid] != n}
    assert not missing, f"ids without their answers: {missing}"
    assert sum(ledger.answered.values()) == sum(ledger.sent.values()) > 0
