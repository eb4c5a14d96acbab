"""Postprocessing in the executor (``gpu_executor/inline_post``), on the real server.

The demo models' chains are microseconds, so the executor answers them itself and the postprocess
pool never sees them; with ``AIENG_INLINE_POSTPROCESS_US=0`` the pool does the same work again, and
the answers are the same.  ``aieng models`` shows the choice and its measured cost per version.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

TEXTS = ["a man is eating food", "the executor answers this one itself", "short"]
PENGUINS = [{"island": "Biscoe", "bill_length_mm": 45.1 + i, "sex": "female"} for i in range(3)]


def answers(srv) -> tuple[dict, list, list]:
    with srv.client() as c:
        models = c.call({"op": "models"})["models"]
        emb = [c.infer("minilm", {"text": t})["outputs"]["embedding"] for t in TEXTS]
        tab = [c.infer("tabular", row)["outputs"] for row in PENGUINS]
    return models, emb, tab


def test_cheap_chains_run_in_the_executor_and_answer_as_the_pool_does(make_server):
    # the limit well above the chains' measured cost: on a loaded machine an 80 us chain measured over the
    # 200 us default once, and the test is about the route, not this machine's speed
    inline = make_server(AIENG_MODELS="minilm,tabular", AIENG_INLINE_POSTPROCESS_US="5000").start()
    models, emb, tab = answers(inline)
    for name in ("minilm", "tabular"):
        choice = models[name]["versions"]["1"]["onnx"]["postprocess"]
        assert choice["where"] == "executor", choice
        assert 0 < choice["us"] <= 5000
    n = len(TEXTS) + len(PENGUINS)
    assert inline.worker_counts("postprocess", n) == {"executor": n}  # the pool never saw them
    inline.stop()

    pool = make_server(AIENG_MODELS="minilm,tabular", AIENG_INLINE_POSTPROCESS_US="0").start()
    models, emb_pool, tab_pool = answers(pool)
    choice = models["tabular"]["versions"]["1"]["onnx"]["postprocess"]
    assert (choice["where"], choice["why"]) == ("pool", "AIENG_INLINE_POSTPROCESS_US is 0")
    assert pool.worker_counts("postprocess", n) == {"post-0": n}
    for a, b in zip(emb, emb_pool):
        np.testing.assert_array_equal(a, b)
    assert [t["label"] for t in tab] == [t["label"] for t in tab_pool]
    for a, b in zip(tab, tab_pool):
        np.testing.assert_array_equal(a["probabilities"], b["probabilities"])


def test_a_chain_with_a_time_limit_stays_in_the_pool(make_server):
    srv = make_server(AIENG_MODELS="textrec").start()
    with srv.client() as c:
        choice = c.call({"op": "models"})["models"]["textrec"]["versions"]["1"]["onnx"]["postprocess"]
    assert (choice["where"], choice["why"]) == ("pool", "step 'ctc_decode' has a time limit")
