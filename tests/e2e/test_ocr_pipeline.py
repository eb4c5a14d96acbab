"""The ``ocr`` pipeline (textdet -> crop -> textrec -> join) through the real server, against rapidocr.

The reference is rapidocr's own pipeline (``RapidOCR``), run in this test process only, on the same
ONNX files the server serves and without the angle classifier (the server has none).  Pages are made
here (``test_ocr_models``'s helpers): text in several fonts and sizes, a table, a figure, rotated
slightly.

* Lines match rapidocr's: the same count, every box at quadrilateral IoU >= 0.9 with rapidocr's, and the
  text exactly equal on at least 95% of them.
* The steps show in the models op, the timing report (``stats``) and the stage metrics.
* Pages in flight together (their crops batched together) get the answers they get alone.
* Bad input: a page with no text has no lines; a 1x1 image gets an answer (the crop cap:
  ``test_ocr_crop_cap.py``).
* A worker (postprocess, the executor) SIGKILLed while a page is in its textrec phase: the page is
  answered once, UNAVAILABLE naming the step, and the service goes on serving; a preprocess worker
  SIGKILLed then costs the page nothing (the steps it held get a second try: frontend/requests/retries.py);
  no shared memory is left after the server stops (the fixture).
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import urllib.request

import numpy as np
import pytest

from aieng.client import AsyncClient, Client
from aieng.tools.report import fetch
from aieng.wire import shm
from tests.conftest import MODELS, ServerProcess
from tests.e2e.ocr_pages import PAGES, call_all, draw_text, fonts, make_page, png, quad_iou

pytestmark = pytest.mark.e2e
STEPS = ("textdet", "crop", "textrec", "join")


@pytest.fixture(scope="module")
def reference():
    from rapidocr import RapidOCR

    return RapidOCR(params={"Global.use_cls": False,
                            "Det.model_path": os.path.join(MODELS, "textdet", "1", "model.onnx"),
                            "Rec.model_path": os.path.join(MODELS, "textrec", "1", "model.onnx")})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("ocrpipe"), AIENG_MODELS="textdet,textrec,ocr",
                        AIENG_PREPROCESS_WORKERS="2", AIENG_POSTPROCESS_WORKERS="1").start(timeout=180)
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def ocr(addr: str, images: list[bytes]) -> list[dict]:
    return call_all(addr, "ocr", images, raise_on_error=False)


@pytest.fixture(scope="module")
def alone(server) -> list[tuple[np.ndarray, dict]]:
    """Each of ``PAGES`` and the server's answer to it sent alone (checked against rapidocr, and the
    answers pages in flight together must get)."""
    pages = [make_page(seed, w, h, angle) for seed, w, h, angle in PAGES]
    return [(page, ocr(server.addr, [png(page)])[0]) for page in pages]


def dense_page(rows: int = 48, cols: int = 14) -> np.ndarray:
    """A page of many tiny separate words: far more text boxes than the crop cap."""
    rng = np.random.default_rng(7)
    fl = fonts() + [None]
    img = np.full((1700, 1240, 3), 255, np.uint8)
    for r in range(rows):
        for c in range(cols):
            draw_text(img, (20 + c * 87, 15 + r * 35), f"{rng.integers(10, 99)}", 15, fl[0])
    return img


# ------------------------------------------------------------ checked against the real thing
def test_ocr_lines_match_rapidocrs_pipeline(alone, reference):
    total = same_text = 0
    for (seed, *_), (page, r) in zip(PAGES, alone):
        want = reference(page)
        assert r["ok"], r
        lines = r["outputs"]["lines"]
        assert r["outputs"]["truncated"] is False and len(lines) == len(want.txts) > 10, seed
        assert set(r["timing_us"]) >= {"textdet", "crop", "textrec", "join", "total"}
        for wb, wt, gl in zip(want.boxes, want.txts, lines):  # the same reading order
            assert quad_iou(wb, gl["box"]) >= 0.9, (seed, wb.tolist(), gl["box"])
            total += 1
            same_text += gl["text"] == wt
    assert same_text >= 0.95 * total, (same_text, total)


def test_the_pipelines_steps_show_in_the_models_op_the_report_and_metrics(server):
    assert ocr(server.addr, [png(make_page(4, 800, 1000))])[0]["ok"]
    with server.client() as c:
        models = c.call({"op": "models"})["models"]
    assert [s["step"] for s in models["ocr"]["versions"]["1"]["steps"]] == list(STEPS)
    steps = fetch(server.addr)["models"]["ocr"]["steps_us"]
    assert set(steps) == set(STEPS) and all(s["runs"] >= 1 for s in steps.values()), steps
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10).read().decode()
    for step in STEPS:
        assert f'aieng_stage_duration_seconds_count{{model="ocr",stage="{step}",version="1"}}' in text, step


def test_pages_in_flight_together_get_the_answers_they_get_alone(server, alone):
    pages = [png(page) for page, _ in alone[:3]]
    assert all(r["ok"] for _, r in alone[:3]), alone
    want_lines = [r["outputs"]["lines"] for _, r in alone[:3]]
    together = ocr(server.addr, pages * 2)  # each page twice: the same image in flight as two requests
    for r, want in zip(together, want_lines * 2):
        assert r["ok"], r
        got = r["outputs"]["lines"]
        assert [ln["text"] for ln in got] == [ln["text"] for ln in want]
        assert [ln["box"] for ln in got] == [ln["box"] for ln in want]
        # padding a crop to a wider neighbour in its batch moves its score a little (rapidocr pads the same)
        np.testing.assert_allclose([ln["score"] for ln in got], [ln["score"] for ln in want], atol=0.05)


# ------------------------------------------------------------ bad input
def test_a_page_with_no_text_has_no_lines(server):
    r = ocr(server.addr, [png(np.full((800, 600, 3), 255, np.uint8))])[0]
    assert r["ok"], r
    assert r["outputs"] == {"lines": [], "truncated": False, "boxes_found": 0}


def test_a_one_pixel_image_is_answered_with_no_lines(server):
    r = ocr(server.addr, [png(np.zeros((1, 1, 3), np.uint8))])[0]
    assert r["ok"], r
    assert r["outputs"]["lines"] == []


def busy_slots(server: ServerProcess) -> dict[str, int]:
    """BUSY slots per live ring of the server (a dead worker's ring may be gone meanwhile)."""
    out = {}
    for name in server.segments():
        try:
            seg = shm.Segment(name)
        except FileNotFoundError:
            continue
        ring = shm.Ring(seg)
        out[name] = int((ring.state == shm.BUSY).sum())
        del ring
        seg.close()
    return out


# The victim is stopped (SIGSTOP) for a moment first, so that it surely holds some of the page's step
# requests when it dies.  The steps a preprocess worker held are preprocessed again: the page is answered.
@pytest.mark.parametrize("victim,answer", [("aieng::postprocess[0]", ("UNAVAILABLE", "step textrec: ")),
                                           ("aieng::executor", ("UNAVAILABLE", "step textrec: ")),
                                           ("aieng::preprocess[0]", ("OK", ""))])
def test_a_worker_killed_in_the_textrec_phase_answers_the_page_once_naming_the_step(server, victim, answer):
    page = png(dense_page(rows=16))  # 224 boxes: a textrec phase of seconds, far inside the deadline
    answers: list = []

    async def run():
        client = AsyncClient(server.addr, timeout_s=120)
        try:
            answers.append(await client.infer("ocr", {"image": page}, raise_on_error=False))
            await asyncio.sleep(1.0)  # a second answer for the same request would arrive here
            answers.append(await client.infer("ocr", {"image": png(make_page(1))}, raise_on_error=False))
        finally:
            client.close()

    t = threading.Thread(target=lambda: asyncio.run(run()))
    t.start()
    # the textrec phase has begun once the page's crop requests are in the table (the textdet phase holds
    # the page and one step): wait for it (bounded by the client's timeout) rather than guess its start
    deadline, in_flight = time.monotonic() + 120, 0
    with Client(server.addr, timeout_s=10) as c:
        while in_flight < 4 and time.monotonic() < deadline:
            in_flight = c.call({"op": "stats", "id": 1})["in_flight"]
            time.sleep(0.02)
    assert in_flight >= 4, "the page never reached its textrec phase"
    pid = server.child_pid(victim)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    t.join(180)
    assert not t.is_alive()
    failed, after = answers
    got = ("OK", "") if failed["ok"] else (failed["error"]["code"], failed["error"]["message"][:14])
    assert got == answer, failed
    assert after["ok"], after  # the service serves (the worker was restarted), its slots were not lost
    with Client(server.addr, timeout_s=10) as c:
        assert c.call({"op": "stats", "id": 1})["in_flight"] == 0
    until = time.monotonic() + 10  # the last consumers' frees of the answered pages' slots, bounded
    while sum(busy_slots(server).values()) and time.monotonic() < until:
        time.sleep(0.1)
    assert sum(busy_slots(server).values()) == 0, busy_slots(server)
