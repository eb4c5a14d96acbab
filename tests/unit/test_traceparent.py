"""W3C traceparent/tracestate parsing and formatting (aieng/wire/traceparent.py)."""
from __future__ import annotations

import pytest

from aieng.wire import traceparent as tp

TID, SID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
GOOD = f"00-{TID}-{SID}-01"


def test_valid_header_parses():
    got = tp.parse(GOOD)
    assert got == tp.TraceParent(TID, SID, 1)
    assert got.sampled
    assert tp.parse(f"00-{TID}-{SID}-00").sampled is False
    assert tp.parse(GOOD.encode()) == got  # gRPC metadata may be bytes
    assert tp.parse(f" {GOOD}\t") == got  # optional whitespace around a header value


def test_flags_other_bits_kept_sampled_is_bit_zero():
    got = tp.parse(f"00-{TID}-{SID}-03")
    assert got.flags == 3 and got.sampled
    assert not tp.parse(f"00-{TID}-{SID}-02").sampled


@pytest.mark.parametrize("value", [
    None, 17, "", "garbage", GOOD[:-1], GOOD + "0", GOOD + "-extra",  # version 00: exactly 55 chars
    GOOD.upper(), f"00-{TID.upper()}-{SID}-01", f"00-{TID}-{SID.upper()}-01", f"00-{TID}-{SID}-0A",
    f"00-{'0' * 32}-{SID}-01", f"00-{TID}-{'0' * 16}-01",  # all-zero ids
    f"ff-{TID}-{SID}-01",  # version ff is invalid
    f"0g-{TID}-{SID}-01", f"00_{TID}-{SID}-01", f"00-{TID}_{SID}-01", f"00-{TID}-{SID}_01",
    f"00-{TID[:-1]}-{SID}0-01", f"00-{TID}-{SID[:-1]}-001", f"00-{TID}z-{SID[:-1]}-01",
    "00-" + "x" * 5000, b"\xff\xfe", f"00-{TID}-{SID}-01, 00-{TID}-{SID}-01",  # two headers joined
])
def test_malformed_is_none(value):
    assert tp.parse(value) is None


def test_future_version_forward_compatible():
    assert tp.parse(f"01-{TID}-{SID}-01") == tp.TraceParent(TID, SID, 1)
    assert tp.parse(f"cc-{TID}-{SID}-01-what-the-future-holds") == tp.TraceParent(TID, SID, 1)
    assert tp.parse(f"cc-{TID}-{SID}-01what") is None  # after 55 chars: nothing or a "-"
    assert tp.parse(f"cc-{TID}-{SID}") is None  # shorter than version 00


def test_format_and_round_trip():
    assert tp.format_header(TID, SID, True) == GOOD
    assert tp.format_header(TID, SID, False) == f"00-{TID}-{SID}-00"
    assert tp.parse(tp.format_header(TID, SID, False)) == tp.TraceParent(TID, SID, 0)


def test_fresh_ids_are_w3c_valid_and_distinct():
    ids = {tp.new_trace_id() for _ in range(200)}
    assert len(ids) == 200 and all(tp.valid_trace_id(i) for i in ids)
    spans = {tp.new_span_id() for _ in range(200)}
    assert len(spans) == 200 and all(len(s) == 16 and int(s, 16) for s in spans)
    assert not tp.valid_trace_id("0" * 32) and not tp.valid_trace_id(TID.upper())
    assert not tp.valid_trace_id(TID[:16]) and not tp.valid_trace_id(None)


def test_tracestate_kept_bounded():
    state = "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"
    assert tp.parse_state(state) == state
    assert tp.parse_state(b"a=b") == "a=b"
    assert tp.parse_state("a=" + "b" * 600) == ""
    assert tp.parse_state("a=\x00b") == "" and tp.parse_state(None) == ""


def test_native_fields_forward_valid_else_fresh_trace_id():
    assert tp.native_fields(GOOD, "k=v") == {"traceparent": GOOD, "tracestate": "k=v"}
    assert tp.native_fields(f"01-{TID}-{SID}-03-more") == {"traceparent": GOOD}  # re-written as version 00
    fresh = tp.native_fields("00-nonsense", "k=v")
    assert list(fresh) == ["trace_id"] and tp.valid_trace_id(fresh["trace_id"])
    assert tp.native_fields(None)["trace_id"] != fresh["trace_id"]
