"""The ``ocr`` pipeline's crop cap (``max_crops``) through the real server: a page with more text boxes than
the cap is answered with the first ``max_crops`` crops read and ``truncated``, and the service goes on
serving.  A copy of the demo repository with the cap at 40, so the page costs 40 recognitions, not 500
(the demo's own cap, whose page took a minute of the suite on 2 cores)."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import MODELS, ServerProcess
from tests.e2e.ocr_pages import call_all, draw_text, fonts, make_page, png

pytestmark = pytest.mark.e2e
CAP = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ocrcap")
    repo = tmp / "repo"
    for name in ("textdet", "textrec", "ocr"):
        shutil.copytree(os.path.join(MODELS, name), repo / name)
    spec = repo / "ocr" / "1" / "model.yaml"
    text = spec.read_text()
    assert "max_crops: 500," in text
    spec.write_text(text.replace("max_crops: 500,", f"max_crops: {CAP},"))
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                        AIENG_POSTPROCESS_WORKERS="1").start(timeout=180)
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def dense_page(rows: int = 6, cols: int = 14):
    """A page of many tiny separate words: more text boxes than the cap."""
    import numpy as np

    rng = np.random.default_rng(7)
    img = np.full((400, 1240, 3), 255, np.uint8)
    for r in range(rows):
        for c in range(cols):
            draw_text(img, (20 + c * 87, 15 + r * 35), f"{rng.integers(10, 99)}", 15, fonts()[0])
    return img


def test_a_page_with_more_boxes_than_the_cap_is_truncated(server):
    r = call_all(server.addr, "ocr", [png(dense_page())], raise_on_error=False)[0]
    assert r["ok"], r
    out = r["outputs"]
    assert out["truncated"] is True and out["boxes_found"] > CAP, out["boxes_found"]
    assert r["crops"] == CAP and 0 < len(out["lines"]) <= CAP
    # and the service goes on serving
    assert call_all(server.addr, "ocr", [png(make_page(0))], raise_on_error=False)[0]["ok"]
