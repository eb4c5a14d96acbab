"""String tensors (ONNX ``tensor(string)``, OIP ``BYTES``, the native map's ``"bytes"``) inside the server.

In a process a string tensor is a numpy object array whose elements are ``bytes`` (``str`` is taken as
its UTF-8 bytes wherever one is read: ``element_bytes``).  In a shared-memory slot it is one blob: per
element, row-major, a 4-byte little-endian length and then its bytes (the OIP binary extension's BYTES
layout); its ``Ref`` descriptor carries numpy's object code ``"|O"`` (``OBJECT``) as its dtype and the
tensor's shape, so descriptors keep one form for every dtype and a numeric tensor's path is unchanged.
``packed_size`` and ``pack`` write it (``shm.Ring.write``), ``unpack`` reads it back (``shm.Ring.views``).
ONNX Runtime's Python binding takes and returns ``str`` elements (it has no bytes string tensor):
``as_str`` turns a request's elements into ``str`` right before the run, so string inputs must be valid
UTF-8 (``check_utf8``, run by the tensor preprocessor, refuses the rest with the element's index).
"""
from __future__ import annotations

import struct

import numpy as np

OBJECT = "|O"  # a string tensor's dtype in a slot descriptor (``np.dtype(object).str``)
_LEN = struct.Struct("<I")


def is_strings(arr: np.ndarray) -> bool:
    """An array of strings: object (our form), or numpy's fixed ``S``/``U`` (a client's)."""
    return arr.dtype.kind in "OSU"


def element_bytes(x) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    raise TypeError(f"a string tensor element must be bytes or str, got {type(x).__name__}")


def packed_size(arr: np.ndarray) -> int:
    return 4 * arr.size + sum(len(element_bytes(x)) for x in arr.reshape(-1))


def pack(arr: np.ndarray) -> bytes:
    parts = []
    for x in arr.reshape(-1):
        b = element_bytes(x)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def unpack(buf, start: int, end: int, shape: list[int]) -> np.ndarray:
    """The object array of ``shape`` packed at ``buf[start:end]`` (``end``: the slot's end, a bound)."""
    count = 1
    for d in shape:
        count *= d
    mv = memoryview(buf)
    out = np.empty(count, dtype=object)
    pos = start
    for i in range(count):
        (n,) = _LEN.unpack_from(mv, pos)
        pos += 4
        if pos + n > end:
            raise ValueError("a packed string tensor runs past its slot")
        out[i] = bytes(mv[pos:pos + n])
        pos += n
    return out.reshape(shape)


def check_utf8(arr: np.ndarray) -> int | None:
    """The flat index of the first element that is not valid UTF-8, or None."""
    for i, x in enumerate(arr.reshape(-1)):
        if isinstance(x, bytes):
            try:
                x.decode("utf-8")
            except UnicodeDecodeError:
                return i
    return None


def as_str(arr: np.ndarray) -> np.ndarray:
    """An object array of ``str`` (what ONNX Runtime takes) from one of bytes or str."""
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, x in enumerate(arr.reshape(-1)):
        flat[i] = x.decode("utf-8") if isinstance(x, bytes) else x
    return out
