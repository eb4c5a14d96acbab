"""W3C trace context (``traceparent``, ``tracestate``): parse, format, fresh ids; pure, shared by the
gateway and the frontend.

``parse`` is strict per the W3C Trace Context spec: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex
flags>``, lowercase only, neither id all zeros, version ``ff`` invalid.  A later version is read by the
spec's forward-compatibility rule: its first 55 characters in the version-00 layout, then nothing or a
``-`` and more.  Anything else is None: the caller starts a fresh trace, never an error.  ``tracestate``
is kept as it came (bounded, printable ASCII) and never interpreted.  ``native_fields``: what a gateway
forwards to the frontend in each native request of one call.
"""
from __future__ import annotations

import random
from typing import Any, NamedTuple

HEADER = "traceparent"
STATE_HEADER = "tracestate"
MAX_STATE_CHARS = 512  # the spec's 32 members fit; a longer one is dropped whole, as the spec allows
_HEX = frozenset("0123456789abcdef")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class TraceParent(NamedTuple):
    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex: the caller's span (our parent)
    flags: int  # trace-flags byte; bit 0: sampled

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)


def _hex(s: str, n: int) -> bool:
    return len(s) == n and _HEX.issuperset(s)


def parse(value: Any) -> TraceParent | None:
    """The ``traceparent`` ``value`` (str or bytes), or None when it is absent or malformed."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or len(value) > 4096:
        return None
    value = value.strip(" \t")
    version = value[:2]
    if not _hex(version, 2) or version == "ff":
        return None
    if version == "00" and len(value) != 55:
        return None
    if len(value) < 55 or (len(value) > 55 and value[55] != "-"):
        return None
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    trace_id, span_id, flags = value[3:35], value[36:52], value[53:55]
    if not (_hex(trace_id, 32) and _hex(span_id, 16) and _hex(flags, 2)):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def parse_state(value: Any) -> str:
    """The ``tracestate`` to keep ("" when absent, too long or not printable ASCII)."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > MAX_STATE_CHARS:
        return ""
    value = value.strip(" \t")
    return value if value.isascii() and value.isprintable() else ""


def format_header(trace_id: str, span_id: str, sampled: bool) -> str:
    """A version-00 ``traceparent``."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def valid_trace_id(s: Any) -> bool:
    return isinstance(s, str) and _hex(s, 32) and s != _ZERO_TRACE


def new_trace_id() -> str:
    """A random 32-hex trace id (W3C: never all zeros).  ``random``, as the OpenTelemetry SDK's own id
    generator: ids must be unique, not secret, and ``secrets`` costs a system call per request."""
    while True:
        tid = random.getrandbits(128)
        if tid:
            return f"{tid:032x}"


def new_span_id() -> str:
    while True:
        sid = random.getrandbits(64)
        if sid:
            return f"{sid:016x}"


def native_fields(traceparent: Any, tracestate: Any = None) -> dict[str, str]:
    """What a gateway adds to each native request of one call: the caller's valid ``traceparent`` (and
    ``tracestate``), else a fresh ``trace_id`` so that the call's rows share one trace."""
    parent = parse(traceparent)
    if parent is None:
        return {"trace_id": new_trace_id()}
    out = {HEADER: format_header(parent.trace_id, parent.span_id, parent.sampled)}
    state = parse_state(tracestate)
    if state:
        out[STATE_HEADER] = state
    return out
