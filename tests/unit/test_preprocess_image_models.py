"""The image resize modes of the layout, textdet and textrec models (aieng/processing/pre/image.py,
models/image_config.py) against the packages' own preprocessing, and the executor's padding of variable-size
images (gpu_executor/sessions.py ``feeds_from``) with the Geometry that maps boxes back to the page.

References: rapidocr (installed, pyproject's dev extra) and rapid_layout (the tree scripts/fetch_models.py
extracts into .cache/vendor), run in this process; the server never imports them.
"""
from __future__ import annotations

import dataclasses
import sys
import types

import numpy as np
import pytest

from aieng.gpu_executor.sessions import ModelSession
from aieng.models import image_config
from aieng.models.repo import ModelError, load_spec
from aieng.processing.post.chain import Chain
from aieng.processing.pre.image import ImagePreprocessor
from aieng.wire.protocol import INVALID_INPUT, RequestError
from tests.unit.demo import MODELS, ROOT

pytestmark = pytest.mark.skipif(
    not all((MODELS / m / "1" / "model.onnx").is_file() for m in ("layout", "textdet", "textrec")),
    reason="OCR demo models missing: run scripts/fetch_models.py")

import cv2  # noqa: E402  (after aieng's image module has set OpenCV's pixel guard)


def spec(name: str):
    return load_spec(name, "1", str(MODELS / name / "1"))


def png(img: np.ndarray) -> bytes:
    return cv2.imencode(".png", img)[1].tobytes()


def page(h: int, w: int, seed: int) -> np.ndarray:
    """White with black text lines of a few sizes."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 255, np.uint8)
    y = 60
    while y < h - 40:
        scale = float(rng.uniform(0.6, 1.4))
        cv2.putText(img, " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"], 4)), (40, y),
                    cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 2, cv2.LINE_AA)
        y += int(50 * scale) + 10
    return img


def crop(words: str, scale: float) -> np.ndarray:
    (tw, th), _ = cv2.getTextSize(words, cv2.FONT_HERSHEY_SIMPLEX, scale, 2)
    img = np.full((th * 2 + 10, tw + 20, 3), 255, np.uint8)
    cv2.putText(img, words, (10, th + 8), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 2, cv2.LINE_AA)
    return img


@pytest.mark.parametrize("model", ["orientation", "layout", "textdet", "textrec"])
def test_normalise_by_table_is_bit_identical_to_the_arithmetic(model):
    """The per-channel tables give exactly ``(img * scale - mean) / std`` in float32, CHW, also for the
    views preprocessing hands it (a centre crop, a crop turned by ``np.rot90``)."""
    pre = ImagePreprocessor(spec(model))
    img = np.random.default_rng(3).integers(0, 256, (300, 500, 3), dtype=np.uint8)
    for view in (img, img[10:234, 20:244, :], np.rot90(img)):
        want = np.ascontiguousarray(((view.astype(np.float32) * pre.scale - pre.mean) / pre.std)
                                    .transpose((2, 0, 1)))
        got = pre.normalise(view)
        assert (got.dtype, got.shape, got.flags.c_contiguous) == (np.float32, want.shape, True)
        assert np.array_equal(got, want)


# ------------------------------------------------------------ declared, checked parameters
@pytest.mark.parametrize("pre,match", [
    ({"resize": "stretch"}, r"resize must be one of short_crop, fixed, limit32, height"),
    ({"resize": "fixed"}, r"size must be \[height, width\]"),
    ({"resize": "limit32", "limit_type": "avg"}, r"limit_type must be min or max"),
    ({"resize": "limit32", "size": [1, 2]}, r"unknown key\(s\) \['size'\] for resize: limit32"),
    ({"resize": "height", "min_width": 400, "max_width": 300}, r"max_width must be an int in 400"),
    ({"mean": [0.5, 0.5]}, r"mean must be a list of 3 numbers"),
])
def test_a_bad_image_section_fails_the_models_load(tmp_path, pre, match):
    import shutil

    d = tmp_path / "m" / "1"
    shutil.copytree(MODELS / "textdet" / "1", d)
    import yaml

    cfg = yaml.safe_load((d / "model.yaml").read_text())
    cfg["preprocess"] = {"type": "image", **pre}
    (d / "model.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ModelError, match=match):
        load_spec("m", "1", str(d))


def test_orientation_keeps_its_defaults():
    cfg = image_config.check(spec("orientation").preprocess.section())
    assert (cfg["resize"], cfg["resize_short"], cfg["crop"]) == ("short_crop", 256, 224)


# ------------------------------------------------------------ same tensors as the packages
def test_layout_input_is_rapid_layouts():
    sys.path.insert(0, str(ROOT / ".cache" / "vendor"))
    from rapid_layout.model_handler.pp.pre_process import PPPreProcess

    img = page(1100, 850, 1)
    out = ImagePreprocessor(spec("layout")).process({"image": png(img)})
    want = PPPreProcess((800, 608))(img)[0]
    np.testing.assert_allclose(out[0][0][1], want, atol=1e-5)
    assert dataclasses.astuple(out.geometry) == (1100, 850, 800, 608) and out[1] == 0


@pytest.mark.parametrize("h,w", [(1000, 800), (500, 1500), (40, 900), (3000, 700)])
def test_textdet_input_is_rapidocrs(h, w):
    from rapidocr.ch_ppocr_det.utils import DetPreProcess

    img = page(h, w, 2)
    pre = ImagePreprocessor(spec("textdet"))
    if h == 40:  # 736 x 16560 after its limit: over max_input_pixels, refused
        with pytest.raises(RequestError) as err:
            pre.process({"image": png(img)})
        assert err.value.code == INVALID_INPUT and "model input, outside" in err.value.message
        return
    out = pre.process({"image": png(img)})
    want = DetPreProcess(736, "min", [0.5] * 3, [0.5] * 3)(img)[0]
    np.testing.assert_allclose(out[0][0][1], want, atol=1e-5)
    assert dataclasses.astuple(out.geometry) == (h, w) + want.shape[1:]
    assert out[1] == want.shape[1] * want.shape[2]


@pytest.mark.parametrize("words,scale", [("ok", 1.0), ("a longer line of text here", 0.8),
                                          ("x" * 60, 1.0)])
def test_textrec_input_is_rapidocrs(words, scale):
    from rapidocr.ch_ppocr_rec.main import TextRecognizer

    img = crop(words, scale)
    out = ImagePreprocessor(spec("textrec")).process({"image": png(img)})
    ratio = img.shape[1] / img.shape[0]
    ref = types.SimpleNamespace(rec_image_shape=[3, 48, 320])
    want = TextRecognizer.resize_norm_img(ref, img, max(320 / 48, ratio))
    np.testing.assert_allclose(out[0][0][1], want, atol=1e-5)
    assert out[1] == want.shape[2]


# ------------------------------------------------------------ padding to the batch's largest
def run(name: str, images: list[np.ndarray]) -> list[dict]:
    """The executor's path in-process: preprocess each, one padded batch (``feeds_from``), one run,
    each request's rows cut out, its chain run with its Geometry."""
    s = spec(name)
    pre, sess, chain = ImagePreprocessor(s), ModelSession(s, "cpu", 1), Chain(s)
    prepared = [pre.process({"image": png(im)}) for im in images]
    feeds, sizes = sess.feeds_from([dict(p[0]) for p in prepared])
    outs = sess.run(feeds)
    return [chain.run(dict(sess.request_outputs(outs, row, sizes[row])), {}, 0, p.geometry).values
            for row, p in enumerate(prepared)]


def quad_iou(a, b) -> float:
    from shapely.geometry import Polygon

    pa, pb = Polygon(a), Polygon(b)
    return pa.intersection(pb).area / pa.union(pb).area


def test_textdet_page_padded_to_a_bigger_page_keeps_its_boxes():
    """The padded region is cut from the map and the boxes land on the page.  Padding does move the
    detector's answer (here: box IoU down to 0.92, box scores by up to 0.057), which is why the served
    textdet is not batched (max_batch_size 1; docs/models.md)."""
    small, big = page(800, 640, 3), page(1100, 900, 4)
    alone = run("textdet", [small])[0]
    batched = run("textdet", [small, big])
    assert len(alone["boxes"]) > 5
    assert len(batched[0]["boxes"]) == len(alone["boxes"])
    for a, b in zip(alone["boxes"], batched[0]["boxes"]):
        assert quad_iou(a, b) >= 0.9
    assert len(batched[1]["boxes"]) == len(run("textdet", [big])[0]["boxes"])
    assert batched[0]["boxes"][:, :, 0].max() < 640 and batched[0]["boxes"][:, :, 1].max() < 800


def test_textrec_crop_padded_to_a_wider_crop_keeps_its_text():
    crops = [crop("hello", 1.0), crop("a considerably longer line of text for the batch", 1.0)]
    alone = [run("textrec", [c])[0] for c in crops]
    batched = run("textrec", crops)
    assert [b["text"] for b in batched] == [a["text"] for a in alone]
    assert alone[0]["text"] == "hello"
    assert batched[0]["score"] == pytest.approx(alone[0]["score"], abs=0.01)
