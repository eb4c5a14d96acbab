"""Unit tests for aieng/models/onnx_meta.py: metadata_props without onnx or a session."""
from __future__ import annotations

from pathlib import Path

import pytest

from aieng.models.onnx_meta import read_metadata

ROOT = Path(__file__).resolve().parents[2]
ORIENTATION = ROOT / "models" / "orientation" / "1" / "model.onnx"

needs_model = pytest.mark.skipif(not ORIENTATION.is_file(), reason="run scripts/fetch_models.py")


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num: int, payload: bytes) -> bytes:
    """A length-delimited (wire type 2) protobuf field."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def entry(key: str, value: str) -> bytes:
    return field(14, field(1, key.encode()) + field(2, value.encode()))


@needs_model
def test_orientation_labels():
    meta = read_metadata(str(ORIENTATION))
    assert meta["character"] == "0\n90\n180\n270"
    assert meta["character"].splitlines() == ["0", "90", "180", "270"]


@needs_model
def test_truncated_model_raises(tmp_path):
    data = ORIENTATION.read_bytes()
    for cut in (len(data) // 2, len(data) - 1, 1):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            read_metadata(str(path))


def test_handmade_model_proto(tmp_path):
    blob = (varint(1 << 3 | 0) + varint(9)  # ir_version = 9 (varint)
            + field(2, b"producer")
            + entry("character", "a\nb")
            + varint(5 << 3 | 5) + b"\0\0\0\0"  # a fixed32 field, skipped
            + varint(6 << 3 | 1) + b"\0" * 8  # a fixed64 field, skipped
            + field(7, field(1, b"graph bytes that look like nothing"))  # graph, skipped
            + entry("empty", "")
            + entry("unicode", "ümlaut ✓"))
    path = tmp_path / "m.onnx"
    path.write_bytes(blob)
    assert read_metadata(str(path)) == {"character": "a\nb", "empty": "", "unicode": "ümlaut ✓"}


def test_no_metadata(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(varint(8) + varint(7))
    assert read_metadata(str(path)) == {}
    path.write_bytes(b"")
    assert read_metadata(str(path)) == {}


@pytest.mark.parametrize("blob", [
    b"\x08\xff",  # varint that never ends
    b"\x72\x05abc",  # field 14 claims 5 bytes, has 3
    b"\x0b",  # wire type 3 (group start): unsupported
    b"\x08" + b"\xff" * 10 + b"\x01",  # varint longer than 64 bits
])
def test_malformed_raises(tmp_path, blob):
    path = tmp_path / "bad.onnx"
    path.write_bytes(blob)
    with pytest.raises(ValueError):
        read_metadata(str(path))


def test_agrees_with_onnx_package(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    helper.set_model_props(model, {"character": "0\n90", "author": "me"})
    path = tmp_path / "id.onnx"
    onnx.save(model, str(path))
    assert read_metadata(str(path)) == {"character": "0\n90", "author": "me"}
