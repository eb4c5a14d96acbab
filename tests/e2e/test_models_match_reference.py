"""Each demo model through the server matches the same model run in-process
by a plain script (scripts/reference.py): cosine >= 0.9999 for embeddings,
identical labels for classifiers."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import reference  # scripts/ (setup.cfg's pythonpath)

from tests.conftest import MODELS, ROOT
from tests.e2e.texts import TEXTS, _documents

pytestmark = pytest.mark.e2e


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_minilm_matches_reference(server):
    ref = reference.minilm_embed(os.path.join(MODELS, "minilm", "1"), TEXTS)
    with server.client() as c:
        for text, want in zip(TEXTS, ref):
            got = c.infer("minilm", {"text": text})["outputs"]["embedding"]
            assert got.dtype == np.float32 and got.shape == (384,)
            assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-4
            assert cosine(got, want) >= 0.9999, text[:40]


def test_orientation_matches_reference(server):
    images = _documents()
    want_labels, want_scores = reference.orientation_classify(
        os.path.join(MODELS, "orientation", "1"), images, vendor_dir=os.path.join(ROOT, ".cache", "vendor"))
    with server.client() as c:
        for img, label, scores in zip(images, want_labels, want_scores):
            out = c.infer("orientation", {"image": img})["outputs"]
            assert out["label"] == label
            np.testing.assert_allclose(out["scores"], scores, atol=1e-4)
    assert set(want_labels) == {"0", "90", "180", "270"}  # the pages really were rotated


def test_tabular_matches_reference(server):
    with open(os.path.join(MODELS, "tabular", "1", "reference.json")) as fh:
        cases = json.load(fh)["cases"]
    rows = [case["input"] for case in cases]
    labels, probs = reference.tabular_classify(os.path.join(MODELS, "tabular", "1"), rows)
    with server.client() as c:
        for row, label, p, case in zip(rows, labels, probs, cases):
            out = c.infer("tabular", row)["outputs"]
            assert out["label"] == label == case["expected_label"]
            np.testing.assert_allclose(out["probabilities"], p, atol=1e-5)
