"""The external wire contract (see docs/protocol.md): one msgpack map per request
and one per response over a ZMQ ROUTER socket.

This module is the single place that knows field names, error codes, the
tensor-map encoding and the unpack limits.  It is used by the frontend, the
workers that build outputs, and the client.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from aieng.wire import strings
from aieng.wire.records import Packed

PROTOCOL_VERSION = 1

# Error codes (docs/protocol.md).
INVALID_REQUEST = "INVALID_REQUEST"
INVALID_INPUT = "INVALID_INPUT"
MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
OVERLOADED = "OVERLOADED"
TIMEOUT = "TIMEOUT"
UNAVAILABLE = "UNAVAILABLE"
INTERNAL = "INTERNAL"
# a server-wide op on the client socket while AIENG_CLIENT_ADMIN_OPS is off
PERMISSION_DENIED = "PERMISSION_DENIED"
ERROR_CODES = (INVALID_REQUEST, INVALID_INPUT, MODEL_NOT_FOUND, OVERLOADED, TIMEOUT, UNAVAILABLE, INTERNAL,
               PERMISSION_DENIED)

OPS = ("infer", "health", "models", "stats", "log_level")

# numeric dtypes a tensor map may carry, always little endian on the wire; and ``bytes``, a string tensor:
# its ``data`` a list of its elements (bin, or str taken as UTF-8), row-major.
DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16",
          "uint8", "bool")
BYTES = "bytes"
MAX_TENSOR_DIMS = 8
# each dtype's wire (little-endian) numpy dtype, built once: ``np.dtype(...).newbyteorder`` costs about
# 1.5 us, and every tensor of every reply a client or the gateway decodes asks
_WIRE_DTYPE = {name: np.dtype(name).newbyteorder("<") for name in DTYPES}
# and each native dtype's name: ``dtype.name`` is Python code in numpy (1.7 us), and every tensor of every
# answer asks (a dtype not here, e.g. a big-endian one, is named the slow way)
_NAMES = {np.dtype(name): name for name in DTYPES}


class RequestError(Exception):
    """A per-request failure; becomes ``{"ok": false, "error": {...}}``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def unpack_limits(max_bytes: int) -> dict[str, int]:
    """The limits on every container of a client message, in msgpack's terms.

    msgpack's own limits are per object; the total size is checked by the caller.  Internal
    messages use the same limits (``aieng.wire.messages.configure``), so anything the frontend
    accepted every worker can decode.
    """
    return dict(max_str_len=max_bytes, max_bin_len=max_bytes, max_array_len=1_000_000, max_map_len=10_000,
                max_ext_len=0)


def unpack_limited(data: bytes | memoryview, max_bytes: int) -> Any:
    """Unpack one msgpack object with explicit limits on every container.

    ``strict_map_key=False`` lets integer keys through so that a bad key is a clear
    INVALID_REQUEST, not a parse error.
    """
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True, **unpack_limits(max_bytes))


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def pack_map(items: dict[str, Any]) -> bytes:
    """``pack(items)`` byte for byte, with each ``records.Packed`` value's bytes spliced in as they are (a
    reply part kept packed between calls: the models op's list)."""
    out = [msgpack.Packer().pack_map_header(len(items))]
    for k, v in items.items():
        out.append(pack(k))
        out.append(v.blob if isinstance(v, Packed) else pack(v))
    return b"".join(out)


def dtype_name(dt: np.dtype) -> str:
    """A dtype as tensor maps and messages name it: ``bytes`` for a string tensor's."""
    return BYTES if dt.kind in "OSU" else dt.name


def encode_tensor(arr: np.ndarray) -> dict[str, Any]:
    arr = np.asarray(arr, order="C")  # not ascontiguousarray: that turns a 0-d array into shape [1]
    if arr.dtype.kind in "OSU":  # a string tensor (``strings.is_strings``, inline: every answer passes here)
        return {"dtype": BYTES, "shape": list(arr.shape),
                "data": [strings.element_bytes(x) for x in arr.reshape(-1).tolist()]}
    name = _NAMES.get(arr.dtype)
    if name is None:
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        name = arr.dtype.name
    return {"dtype": name, "shape": list(arr.shape), "data": arr.tobytes()}


def decode_tensor(value: Any, what: str = "tensor") -> np.ndarray:
    """Decode a tensor map into a read-only numpy view over its bytes."""
    if not isinstance(value, dict):
        raise RequestError(INVALID_INPUT, f"{what}: expected a tensor map")
    dtype, shape, data = value.get("dtype"), value.get("shape"), value.get("data")
    if dtype not in DTYPES and dtype != BYTES:
        raise RequestError(INVALID_INPUT, f"{what}: unsupported dtype {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape)):
        raise RequestError(INVALID_INPUT,
                           f"{what}: shape must be a list of up to {MAX_TENSOR_DIMS} non-negative ints")
    count = 1
    for d in shape:
        count *= d
    if dtype == BYTES:
        return _decode_strings(data, shape, count, what)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RequestError(INVALID_INPUT, f"{what}: data must be bin")
    dt = _WIRE_DTYPE[dtype]
    if count * dt.itemsize != len(data):
        raise RequestError(INVALID_INPUT,
                           f"{what}: shape {shape} x {dtype} needs {count * dt.itemsize} bytes, "
                           f"got {len(data)}")
    return np.frombuffer(data, dtype=dt).reshape(shape)


def _decode_strings(data: Any, shape: list[int], count: int, what: str) -> np.ndarray:
    """A ``bytes`` tensor map's elements as an object array of bytes."""
    if not isinstance(data, list):
        raise RequestError(INVALID_INPUT, f"{what}: a bytes tensor's data must be a list of its elements")
    if len(data) != count:
        raise RequestError(INVALID_INPUT, f"{what}: shape {shape} needs {count} elements, got {len(data)}")
    arr = np.empty(count, dtype=object)
    for i, x in enumerate(data):
        if isinstance(x, str):
            x = x.encode("utf-8")
        elif not isinstance(x, bytes):
            raise RequestError(INVALID_INPUT,
                               f"{what}: element {i} must be bin or str, got {type(x).__name__}")
        arr[i] = x
    return arr.reshape(shape)


def error_body(req_id: Any, code: str, message: str, trace: str | None = None,
               extra: dict[str, Any] | None = None) -> bytes:
    """An error answer; ``extra`` adds fields (an admitted request's ``model``, ``version``, ``route``)."""
    body: dict[str, Any] = {"id": req_id, "ok": False, "error": {"code": code, "message": message}}
    if trace:
        body["trace_id"] = trace
    if extra:
        body.update(extra)
    return pack(body)


def result_body(req_id: Any, model: str, version: str, packed_outputs: bytes,
                timing_us: dict[str, int], extra: dict[str, Any] | None = None) -> bytes:
    """Build a success response around outputs that a worker already packed.

    msgpack maps are a header followed by key/value pairs, so the frontend
    splices the worker's packed ``outputs`` map in without decoding it.
    """
    head: dict[str, Any] = {"id": req_id, "ok": True, "model": model, "version": version,
                            "timing_us": timing_us}
    if extra:
        head.update(extra)
    n = len(head) + 1
    if n > 15:  # pragma: no cover - fixmap only; we never have that many keys
        raise ValueError("too many response fields")
    parts = [bytes([0x80 | n])]
    for k, v in head.items():
        parts.append(pack(k))
        parts.append(pack(v))
    parts.append(pack("outputs"))
    parts.append(packed_outputs)
    return b"".join(parts)


MAX_ROUTING_KEY_CHARS = 256


def routing_key(req: dict) -> str | None:
    """The request's ``routing_key`` (a str, or an int taken as its decimal str), or None."""
    key = req.get("routing_key")
    if key is None:
        return None
    if isinstance(key, int) and not isinstance(key, bool) and -(2 ** 63) <= key < 2 ** 64:
        return str(key)
    if isinstance(key, str) and 0 < len(key) <= MAX_ROUTING_KEY_CHARS:
        return key
    raise RequestError(INVALID_REQUEST, f"'routing_key' must be a str of 1..{MAX_ROUTING_KEY_CHARS} "
                                        f"characters or an int")


def valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(2 ** 63) <= value < 2 ** 64
    return isinstance(value, str) and len(value) <= 256
