"""Open Inference Protocol tensors <-> aieng's native inputs and outputs (pure, no I/O).

``Tensor(name, datatype, shape, data)``, batch first: ``data`` is a numpy array (numeric datatypes) or a
list of ``bytes`` (``BYTES``).  ``from_json`` reads JSON ``data``; ``from_raw`` raw bytes (the HTTP binary
tensor extension, gRPC's ``raw_input_contents``; a ``BYTES`` element is a 4-byte little-endian length and
its bytes).  ``split_rows`` makes one native input map per row by the model's input kinds (text and
category: str; image: bytes; number: float, NaN missing; tensor: row i's tensor map, of any datatype,
``BYTES`` as a ``bytes`` map); a model that does not batch (``max_batch_size`` 1) takes no batch
dimension, as in Triton.  ``join_rows`` stacks the native answers back: ``tensor`` outputs keep their
dtype, rows first (a string tensor's as ``BYTES``); ``str`` outputs become ``BYTES`` [N],
``number`` outputs ``FP64`` [N], lists and maps (e.g. ``top_k``) ``BYTES`` [N] of JSON text.  Every
problem with a request is a ``RequestError`` with an INVALID_* code (HTTP 400).  The datatypes and
shapes each kind takes: docs/oip.md ("Tensors").
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from aieng.wire.protocol import INTERNAL, INVALID_INPUT, INVALID_REQUEST, RequestError, encode_tensor

NUMERIC = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
           "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
           "FP32": "float32", "FP64": "float64"}
DATATYPES = tuple(NUMERIC) + ("BYTES",)
# a string tensor: ``bytes`` in tensor maps and a model.yaml's output dtype, ``object`` in numpy
BY_DTYPE = {**{v: k for k, v in NUMERIC.items()}, "bytes": "BYTES", "object": "BYTES", "string": "BYTES"}
# the same by numpy dtype: ``dtype.name`` is Python code in numpy (3 us), and every answer asks
_BY_NP = {np.dtype(v): k for k, v in NUMERIC.items()} | {np.dtype(object): "BYTES"}
_LE = {k: np.dtype(v).newbyteorder("<") for k, v in NUMERIC.items()}  # each datatype's wire dtype, built once
MAX_DIMS = 8
ROW_KINDS = ("text", "category", "image", "number")


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    data: Any  # np.ndarray (numeric) or list[bytes] (BYTES), flat until ``array`` reshapes it

    def array(self) -> np.ndarray:
        if self.datatype == "BYTES":
            arr = np.empty(len(self.data), dtype=object)
            arr[:] = self.data
            return arr.reshape(self.shape)
        return self.data.reshape(self.shape)


def _bad(message: str) -> RequestError:
    return RequestError(INVALID_INPUT, message)


def check_head(name: Any, datatype: Any, shape: Any) -> int:
    """Validate an input's name, datatype and shape; return its element count."""
    if not isinstance(name, str) or not name:
        raise RequestError(INVALID_REQUEST, "every input needs a non-empty string 'name'")
    if datatype not in DATATYPES:
        raise _bad(f"input '{name}': unsupported datatype {datatype!r} (one of {', '.join(DATATYPES)})")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS  # [] is a scalar (a model without batching)
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2 ** 31 for d in shape)):
        raise _bad(f"input '{name}': shape must be 0..{MAX_DIMS} non-negative integers, got {shape!r}")
    count = 1
    for d in shape:
        count *= d
    return count


def _flatten(value: Any, out: list, depth: int = 0) -> None:
    if depth > MAX_DIMS:
        raise _bad("'data' is nested deeper than the shape allows")
    for item in value:
        if isinstance(item, list):
            _flatten(item, out, depth + 1)
        else:
            out.append(item)


def from_json(name: str, datatype: str, shape: list[int], data: Any) -> Tensor:
    """A tensor from JSON ``data`` (flat or nested, row-major); element types are checked, not coerced."""
    count = check_head(name, datatype, shape)
    if not isinstance(data, list):
        raise _bad(f"input '{name}': 'data' must be a list")
    flat: list = []
    _flatten(data, flat)
    if len(flat) != count:
        raise _bad(f"input '{name}': shape {shape} needs {count} elements, 'data' has {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise _bad(f"input '{name}': BYTES elements in JSON must be strings")
        return Tensor(name, datatype, shape, [x.encode("utf-8") for x in flat])
    if datatype == "BOOL":
        if not all(isinstance(x, bool) for x in flat):
            raise _bad(f"input '{name}': BOOL elements must be true or false")
    else:
        want = float if datatype.startswith("FP") else int
        if not all(isinstance(x, (int, float) if want is float else int) and not isinstance(x, bool)
                   for x in flat):
            raise _bad(f"input '{name}': {datatype} elements must be {want.__name__}s")
    try:
        arr = np.array(flat, dtype=NUMERIC[datatype])
    except (OverflowError, ValueError) as exc:
        raise _bad(f"input '{name}': {exc}") from None
    return Tensor(name, datatype, shape, arr)


def from_raw(name: str, datatype: str, shape: list[int], raw: bytes | memoryview) -> Tensor:
    """A tensor from raw little-endian bytes; their size must agree with shape and datatype exactly."""
    count = check_head(name, datatype, shape)
    if datatype == "BYTES":
        return Tensor(name, datatype, shape, unpack_bytes(raw, count, name))
    dt = _LE[datatype]
    if len(raw) != count * dt.itemsize:
        raise _bad(f"input '{name}': shape {shape} x {datatype} needs {count * dt.itemsize} bytes, "
                   f"got {len(raw)}")
    return Tensor(name, datatype, shape, np.frombuffer(raw, dtype=dt))


def unpack_bytes(raw: bytes | memoryview, count: int, name: str) -> list[bytes]:
    """Length-prefixed BYTES elements: exactly ``count`` of them and nothing after."""
    mv = memoryview(raw)
    out, pos, end = [], 0, len(mv)
    for _ in range(count):
        if pos + 4 > end:
            raise _bad(f"input '{name}': BYTES data ends inside an element's length")
        (n,) = struct.unpack_from("<I", mv, pos)
        pos += 4
        if pos + n > end:
            raise _bad(f"input '{name}': a BYTES element of {n} bytes runs past the data")
        out.append(bytes(mv[pos:pos + n]))
        pos += n
    if pos != end:
        raise _bad(f"input '{name}': {end - pos} bytes left after {count} BYTES elements")
    return out


def pack_bytes(items) -> bytes:
    parts = []
    for item in items:
        b = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def raw_of(datatype: str, arr: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return pack_bytes(arr.reshape(-1))
    return np.ascontiguousarray(arr, dtype=_LE[datatype]).tobytes()


def json_data(datatype: str, arr: np.ndarray) -> list:
    flat = arr.reshape(-1)
    if datatype == "BYTES":
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    return flat.tolist()


# -- rows ----------------------------------------------------------------------------------------
def _row_value(kind: str, t: Tensor, flat: Any, i: int) -> Any:
    if kind in ("text", "category"):
        try:
            return flat[i].decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"input '{t.name}': element {i} is not valid UTF-8") from None
    if kind == "image":
        return flat[i]
    x = float(flat[i])
    return None if math.isnan(x) else x


def _check_datatype(t: Tensor, kind: str) -> None:
    if kind == "tensor":  # any datatype: the executor checks it against the graph's (one message)
        return
    want_bytes = kind in ("text", "category", "image")
    if want_bytes != (t.datatype == "BYTES") or (kind == "number" and t.datatype == "BOOL"):
        need = "BYTES" if want_bytes else "a numeric datatype"
        raise _bad(f"input '{t.name}' ({kind}): datatype must be {need}, got {t.datatype}")


def split_rows(kinds: dict[str, str], tensors: list[Tensor], max_rows: int,
               batched: bool = True) -> list[dict[str, Any]]:
    """One native ``inputs`` map per row (see the module docstring for the shapes each kind takes).

    A model that does not batch takes no batch dimension: its tensor inputs are the request's whole
    tensor and every other input one element (shape [1]); one request, one row."""
    if not tensors and (kinds or batched):  # a graph without inputs (a constant) takes none
        raise _bad("the request has no inputs")
    if not batched:
        return [_one_row(kinds, tensors)]
    rows = None
    seen = set()
    for t in tensors:
        if t.name in seen:
            raise _bad(f"input '{t.name}' is given twice")
        seen.add(t.name)
        kind = kinds.get(t.name)
        if kind is None:
            raise _bad(f"the model has no input '{t.name}' (it has {', '.join(kinds) or 'none'})")
        if not t.shape:
            raise _bad(f"input '{t.name}': a scalar, but the model batches: shape must start with the rows")
        if kind in ROW_KINDS and not (len(t.shape) == 1 or (len(t.shape) == 2 and t.shape[1] == 1)):
            raise _bad(f"input '{t.name}' ({kind}): shape must be [N] or [N, 1], got {t.shape}")
        _check_datatype(t, kind)
        if rows is None:
            rows = t.shape[0]
        elif t.shape[0] != rows:
            raise _bad(f"inputs disagree on the number of rows ({rows} and {t.shape[0]} in '{t.name}')")
    if not 1 <= rows <= max_rows:
        raise _bad(f"a request holds 1..{max_rows} rows (the model's max_batch_size), got {rows}")
    out: list[dict[str, Any]] = [{} for _ in range(rows)]
    for t in tensors:
        kind = kinds[t.name]
        if kind == "tensor":
            arr = t.array()
            for i in range(rows):
                out[i][t.name] = encode_tensor(arr[i])
        else:
            flat = t.data
            for i in range(rows):
                out[i][t.name] = _row_value(kind, t, flat, i)
    return out


def _one_row(kinds: dict[str, str], tensors: list[Tensor]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for t in tensors:
        kind = kinds.get(t.name)
        if kind is None:
            raise _bad(f"the model has no input '{t.name}' (it has {', '.join(kinds) or 'none'})")
        if t.name in row:
            raise _bad(f"input '{t.name}' is given twice")
        _check_datatype(t, kind)
        if kind == "tensor":
            row[t.name] = encode_tensor(t.array())
            continue
        if t.shape not in ([1], [1, 1]):
            raise _bad(f"input '{t.name}' ({kind}): the model does not batch: shape must be [1], "
                       f"got {t.shape}")
        row[t.name] = _row_value(kind, t, t.data, 0)
    return row


def join_rows(name: str, values: list[Any]) -> tuple[str, np.ndarray]:
    """Stack one output's per-row native values into ``(datatype, array)`` with the rows first."""
    first = values[0]
    if isinstance(first, np.ndarray):
        datatype = _BY_NP.get(first.dtype) or BY_DTYPE.get(first.dtype.name)
        if datatype is None:
            raise RequestError(INTERNAL, f"output '{name}' has dtype {first.dtype} with no OIP datatype")
        if len(values) == 1:  # one row (most requests): a view with the row axis, not a stacked copy
            return datatype, first[None]
        try:
            return datatype, np.stack(values)
        except ValueError:
            raise RequestError(INTERNAL, f"output '{name}' has a different shape per row") from None
    if all(isinstance(v, str) for v in values):
        arr = np.empty(len(values), dtype=object)
        arr[:] = [v.encode("utf-8") for v in values]
        return "BYTES", arr
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "FP64", np.array(values, dtype=np.float64)
    arr = np.empty(len(values), dtype=object)  # lists and maps (e.g. top_k): JSON text per row
    arr[:] = [json.dumps(v, default=str).encode("utf-8") for v in values]
    return "BYTES", arr
