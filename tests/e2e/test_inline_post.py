"""Postprocessing in the executor (``gpu_executor/inline_post``), on the real server.

The demo models' chains are microseconds, so the executor answers them itself and the postprocess
pool never sees them; with ``AIENG_INLINE_POSTPROCESS_US=0`` the pool does the same work again, and
the answers are the same.  ``aieng models`` shows the choice and its measured cost per version.
"""
from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

TEXTS = ["a man is eating food", "the executor answers this one itself", "short"]
PENGUINS = [{"island": "Biscoe", "bill_length_mm": 45.1 + i, "sex": "female"} for i in range(3)]


def answers(srv) -> tuple[dict, list, list]:
    with srv.client() as c:
        models = c.call({"op": "models"})["models"]
        emb = [c.infer("minilm", {"text": t})["outputs"]["embedding"] for t in TEXTS]
        tab = [c.infer("tabular", row)["outputs"] for row in PENGUINS]
    return models, emb, tab


def post_counts(srv, n: int) -> dict:
    """aieng_worker_requests_total of the postprocess role, per worker, once /metrics counts ``n`` (it is
    rendered at most every AIENG_SNAPSHOT_MS: a bounded wait)."""
    deadline = time.monotonic() + 5
    while True:
        with urllib.request.urlopen(srv.http + "/metrics", timeout=5) as r:
            text = r.read().decode()
        got = {s.labels["worker"]: s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name == "aieng_worker_requests_total"
               and s.labels.get("role") == "postprocess" and s.value}
        if sum(got.values()) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_cheap_chains_run_in_the_executor_and_answer_as_the_pool_does(make_server):
    inline = make_server(AIENG_MODELS="minilm,tabular").start()
    models, emb, tab = answers(inline)
    for name in ("minilm", "tabular"):
        choice = models[name]["versions"]["1"]["onnx"]["postprocess"]
        assert choice["where"] == "executor", choice
        assert 0 < choice["us"] <= 200
    n = len(TEXTS) + len(PENGUINS)
    assert post_counts(inline, n) == {"executor": n}  # the pool never saw them
    inline.stop()

    pool = make_server(AIENG_MODELS="minilm,tabular", AIENG_INLINE_POSTPROCESS_US="0").start()
    models, emb_pool, tab_pool = answers(pool)
    choice = models["tabular"]["versions"]["1"]["onnx"]["postprocess"]
    assert (choice["where"], choice["why"]) == ("pool", "AIENG_INLINE_POSTPROCESS_US is 0")
    assert post_counts(pool, n) == {"post-0": n}
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
