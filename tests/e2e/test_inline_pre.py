"""Preprocessing in the executor for a small request that finds the server idle
(``gpu_executor/inline_pre``), on the real server.  Images too: one whose header declares at most
``AIENG_INLINE_IMAGE_PIXELS`` is decoded in the executor while the server is idle.

One request at a time, a short text or a tabular row goes straight to the executor, which encodes it,
runs it and answers: the preprocess pool never sees it.  A body over ``AIENG_INLINE_PREPROCESS_BYTES``
goes through the pool as before, and with the setting at 0 everything does; the answers and the
errors are the same either way.  (Which requests find the server idle is the frontend's rule, tested
against fake peers in tests/component: there the second request in flight provably takes the pool.)
A model whose run dwarfs its encoding (minilm) skips the pool under load too.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aieng.client import AsyncClient
from aieng.tools.loadgen import text_mix
from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e

TEXTS = ["a man is eating food", "the executor encodes this one itself", "short"]
LONG = " ".join(["a much longer text that is over the limit and goes through the pool"] * 4)  # > 200 bytes
PENGUINS = [{"island": "Biscoe", "bill_length_mm": 45.1 + i, "sex": "female"} for i in range(3)]
BAD = [{"text": "   "}, {"txt": "x"}]


def run(srv) -> tuple[dict, list, list, list]:
    """One request at a time: models' view, embeddings (short texts, then the long one), tabular outputs,
    the bad inputs' errors."""
    with srv.client() as c:
        models = c.call({"op": "models"})["models"]
        emb = [c.infer("minilm", {"text": t})["outputs"]["embedding"] for t in TEXTS + [LONG]]
        tab = [c.infer("tabular", row)["outputs"] for row in PENGUINS]
        errors = []
        for inputs in BAD:
            request = {"op": "infer", "id": "bad", "model": "minilm", "inputs": inputs}
            reply = c.call(request, raise_on_error=False)
            errors.append((reply["id"], reply["ok"], reply["error"]["code"], reply["error"]["message"]))
    return models, emb, tab, errors


@pytest.fixture(scope="module")
def direct(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("direct"), AIENG_MODELS="minilm,tabular",
                        AIENG_PREPROCESS_WORKERS="1", AIENG_INLINE_PREPROCESS_BYTES="200",
                        AIENG_INLINE_POSTPROCESS_US="5000").start()  # postprocessed here whatever the load
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def counted(srv, before: dict, n: int) -> dict:
    """Requests each preprocessor encoded since ``before`` (a ``worker_counts`` reading), once ``n`` more."""
    now = srv.worker_counts("preprocess", sum(before.values()) + n)
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def test_an_idle_servers_small_requests_skip_the_pool_and_answer_as_the_pool_does(direct, make_server):
    before = direct.worker_counts("preprocess", 0)
    models, emb, tab, errors = run(direct)
    # measured when built: tokenising a 200-byte text is a small share of minilm's run, not so a tabular row's
    where = [models[name]["versions"]["1"]["onnx"]["preprocess"]["where"] for name in ("minilm", "tabular")]
    assert where == ["executor at any load", "executor when idle"]
    small = len(TEXTS) + len(PENGUINS) + len(BAD)
    # the long text's body is over 200 bytes: the pool encodes it; everything else the executor did (the bad
    # inputs failed there, counted as its preprocessing: Failed.stage)
    assert counted(direct, before, small + 1) == {"executor": small, "pre-0": 1}

    pool = make_server(AIENG_MODELS="minilm,tabular", AIENG_PREPROCESS_WORKERS="1",
                       AIENG_INLINE_PREPROCESS_BYTES="0").start()
    models, emb_pool, tab_pool, errors_pool = run(pool)
    assert models["minilm"]["versions"]["1"]["onnx"]["preprocess"] == {
        "where": "pool", "why": "AIENG_INLINE_PREPROCESS_BYTES is 0"}
    assert pool.worker_counts("preprocess", small + 1) == {"pre-0": small + 1}
    for a, b in zip(emb, emb_pool, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(tab, tab_pool, strict=True):
        assert a["label"] == b["label"]
        np.testing.assert_array_equal(a["probabilities"], b["probabilities"])
    assert errors == errors_pool
    assert errors[0] == ("bad", False, "INVALID_INPUT", "input 'text' is empty")


def test_under_load_a_model_whose_run_dwarfs_its_encoding_still_skips_the_pool(direct):
    texts = [t for t in text_mix(40, seed=5) if len(t.encode()) < 150][:24]  # all under the 200-byte limit
    assert len(texts) == 24
    before = direct.worker_counts("preprocess", 0)

    async def together() -> list[dict]:
        client = AsyncClient(direct.addr, timeout_s=60)
        try:
            return await asyncio.gather(*(client.infer("minilm", {"text": t}) for t in texts))
        finally:
            client.close()

    replies = asyncio.run(together())
    assert [r["ok"] for r in replies] == [True] * len(texts)
    # batched together in the executor: each of those was sent to it while others were in flight there
    assert max(r["batch"] for r in replies) > 1
    assert counted(direct, before, len(texts)) == {"executor": len(texts)}
    with direct.client() as c:
        view = c.call({"op": "models"})["models"]["minilm"]["versions"]["1"]["onnx"]["preprocess"]
    assert view["where"] == "executor at any load"


def jpeg(h: int, w: int, seed: int) -> bytes:
    import cv2

    img = np.random.default_rng(seed).integers(0, 255, size=(h, w, 3), dtype=np.uint8)
    return cv2.imencode(".jpg", img)[1].tobytes()


IMAGES = [jpeg(300, 400, 1), jpeg(240, 320, 2), jpeg(400, 500, 3)]  # up to 200,000 pixels: the executor's
OVER = jpeg(401, 500, 4)  # 200,500 pixels: the pool's


def run_images(srv) -> tuple[dict, list, tuple]:
    """One image at a time: the version's preprocess view, the scores (small images, then the big one), and
    a cut-off JPEG's error (its header reads as small; its decoding fails)."""
    with srv.client() as c:
        view = c.call({"op": "models"})["models"]["orientation"]["versions"]["1"]["onnx"]["preprocess"]
        scores = [c.infer("orientation", {"image": b})["outputs"]["scores"] for b in IMAGES + [OVER]]
        cut = {"op": "infer", "id": "cut", "model": "orientation", "inputs": {"image": IMAGES[0][:400]}}
        reply = c.call(cut, raise_on_error=False)
    return view, scores, (reply["id"], reply["ok"], reply["error"]["code"], reply["error"]["message"])


def test_an_idle_servers_small_image_is_decoded_in_the_executor_and_answers_as_the_pool_does(make_server):
    env = {"AIENG_MODELS": "orientation", "AIENG_PREPROCESS_WORKERS": "1",
           "AIENG_INLINE_POSTPROCESS_US": "5000"}  # postprocessed here whatever this machine measures
    srv = make_server(**env, AIENG_INLINE_IMAGE_PIXELS="200000").start()
    before = srv.worker_counts("preprocess", 0)
    view, scores, error = run_images(srv)
    assert view == {"where": "executor when idle", "why": "'image' requests up to 200000 pixels, while idle"}
    # the small images and the cut-off one (its header says 400x300) were the executor's; the big one not
    assert counted(srv, before, len(IMAGES) + 2) == {"executor": len(IMAGES) + 1, "pre-0": 1}

    pool = make_server(**env, AIENG_INLINE_IMAGE_PIXELS="0").start()
    view_pool, scores_pool, error_pool = run_images(pool)
    assert view_pool == {"where": "pool", "why": "AIENG_INLINE_IMAGE_PIXELS is 0"}
    assert pool.worker_counts("preprocess", len(IMAGES) + 2) == {"pre-0": len(IMAGES) + 2}
    for a, b in zip(scores, scores_pool, strict=True):
        np.testing.assert_array_equal(a, b)
    assert error == error_pool
    assert error[:3] == ("cut", False, "INVALID_INPUT")
