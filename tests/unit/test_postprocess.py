"""Unit tests for the demo models' postprocessing (the single-op form, built as a one-step chain)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aieng.models.sections import Postprocess
from aieng.processing.post.chain import Chain
from aieng.wire.protocol import INVALID_INPUT, RequestError
from tests.unit.demo import MODELS, ROOT, needs_demo_models, spec  # noqa: F401
from tests.unit.demo import spec_with as _spec_with

pytestmark = needs_demo_models


def spec_with(name: str, **post):
    return _spec_with(name, "postprocess", **post)


def np_softmax(x):
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


def MeanPool(s):  # noqa: N802 - the old class names, now one-step chains
    return Chain(s)


Classify = Passthrough = MeanPool


def test_single_op_form_is_a_one_step_chain():
    for name in ("minilm", "orientation", "tabular"):
        chain = Chain(spec(name))
        assert [(s["name"], s["op"], s["timeout_ms"]) for s, _ in chain.steps] == \
            [(spec(name).postprocess.type,) * 2 + (0.0,)]


# ------------------------------------------------------------ mean pool
def test_mean_pool_mean_and_l2_norm():
    op = MeanPool(spec("minilm"))
    hidden = np.random.default_rng(0).standard_normal((7, 384)).astype(np.float32)
    out = op({"last_hidden_state": hidden}, {})
    assert list(out) == ["embedding"]
    v = out["embedding"]
    assert v.dtype == np.float32 and v.shape == (384,)
    expected = hidden.astype(np.float64).mean(axis=0)
    expected /= np.linalg.norm(expected)
    np.testing.assert_allclose(v, expected, rtol=1e-6, atol=1e-7)
    assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-6)


def test_mean_pool_single_token_and_1d():
    op = MeanPool(spec("minilm"))
    row = np.array([[3.0, 4.0]], np.float32)
    np.testing.assert_allclose(op({"last_hidden_state": row}, {})["embedding"], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(op({"last_hidden_state": row[0]}, {})["embedding"], [0.6, 0.8], rtol=1e-6)


def test_mean_pool_without_normalisation():
    op = MeanPool(spec_with("minilm", normalize=False, output="vec"))
    x = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)
    out = op({"last_hidden_state": x}, {})
    np.testing.assert_array_equal(out["vec"], np.array([2.0, 4.0], np.float32))


def test_mean_pool_zero_vector_stays_finite():
    op = MeanPool(spec("minilm"))
    v = op({"last_hidden_state": np.zeros((3, 8), np.float32)}, {})["embedding"]
    assert np.all(v == 0) and np.all(np.isfinite(v))


def test_mean_pool_reads_views_without_modifying_them():
    op = MeanPool(spec("minilm"))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x.flags.writeable = False  # outputs arrive as read-only shared-memory views
    op({"last_hidden_state": x}, {})
    np.testing.assert_array_equal(x, np.arange(12, dtype=np.float32).reshape(3, 4))


# ------------------------------------------------------------ classify
def test_classify_labels_from_onnx_metadata():
    op = Classify(spec("orientation"))
    assert op.steps[0][1].labels == ["0", "90", "180", "270"]
    scores = np.array([[0.1, 0.7, 0.15, 0.05]], np.float32)  # the executor hands one row as [1, 4]
    out = op({"fetch_name_0": scores}, {})
    assert set(out) == {"label", "scores"}
    assert out["label"] == "90"
    assert out["scores"].dtype == np.float32 and out["scores"].shape == (4,)
    np.testing.assert_array_equal(out["scores"], scores[0])  # activation: none


def test_classify_labels_from_file():
    op = Classify(spec("tabular"))
    assert op.steps[0][1].labels == ["Adelie", "Chinstrap", "Gentoo"]
    out = op({"probabilities": np.array([0.1, 0.2, 0.7], np.float32)}, {})
    assert out["label"] == "Gentoo" and set(out) == {"label", "probabilities"}


def test_classify_top_k():
    op = Classify(spec("orientation"))
    scores = np.array([0.1, 0.7, 0.15, 0.05], np.float32)
    out = op({"fetch_name_0": scores}, {"top_k": 2})
    assert [lab for lab, _ in out["top_k"]] == ["90", "180"]
    assert [s for _, s in out["top_k"]] == pytest.approx([0.7, 0.15])
    assert all(isinstance(s, float) for _, s in out["top_k"])  # plain floats: msgpack-able
    out = op({"fetch_name_0": scores}, {"top_k": 10})  # more than there are: all of them
    assert [lab for lab, _ in out["top_k"]] == ["90", "180", "0", "270"]
    assert "top_k" not in op({"fetch_name_0": scores}, {})


def test_classify_top_k_ties_are_stable():
    op = Classify(spec("orientation"))
    out = op({"fetch_name_0": np.array([0.25, 0.25, 0.25, 0.25], np.float32)}, {"top_k": 4})
    assert [lab for lab, _ in out["top_k"]] == ["0", "90", "180", "270"]
    assert out["label"] == "0"


@pytest.mark.parametrize("top_k", [0, -1, "2", 1.5, 2.0, True, False, [2], {"k": 2}])
def test_classify_bad_top_k(top_k):
    op = Classify(spec("orientation"))
    with pytest.raises(RequestError) as ei:
        op({"fetch_name_0": np.zeros(4, np.float32)}, {"top_k": top_k})
    assert ei.value.code == INVALID_INPUT and "top_k" in ei.value.message


def test_classify_softmax_activation():
    op = Classify(spec_with("orientation", activation="softmax"))
    logits = np.array([[2.0, -1.0, 0.5, 1000.0]], np.float32)  # large logit: must not overflow
    out = op({"fetch_name_0": logits}, {"top_k": 1})
    p = out["scores"]
    assert p.dtype == np.float32 and np.all(np.isfinite(p))
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(p, np_softmax(logits[0]), rtol=1e-6, atol=1e-12)
    assert out["label"] == "270" and out["top_k"][0][0] == "270"

    small = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    np.testing.assert_allclose(op({"fetch_name_0": small}, {})["scores"], np_softmax(small), rtol=1e-6)


def test_classify_sigmoid_activation():
    op = Classify(spec_with("orientation", activation="sigmoid"))
    x = np.array([0.0, 2.0, -2.0, -80.0], np.float32)
    p = op({"fetch_name_0": x}, {})["scores"]
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    assert out_label(op, x) == "90"


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_classify_sigmoid_extreme_logits_stay_finite():
    op = Classify(spec_with("orientation", activation="sigmoid"))
    p = op({"fetch_name_0": np.array([-1000.0, 1000.0, 0.0, -3e38], np.float32)}, {})["scores"]
    np.testing.assert_array_equal(p, np.array([0.0, 1.0, 0.5, 0.0], np.float32))


def out_label(op, x):
    return op({"fetch_name_0": x}, {})["label"]


def test_classify_unknown_activation():
    with pytest.raises(ValueError, match="step 1 'classify'.*activation"):
        Classify(spec_with("orientation", activation="relu"))


def test_classify_without_labels_uses_indices():
    op = Classify(spec_with("orientation", labels={}, label_output="cls", scores_output="s"))
    out = op({"fetch_name_0": np.array([0.1, 0.2, 0.9, 0.0], np.float32)}, {"top_k": 2})
    assert out["cls"] == "2" and [lab for lab, _ in out["top_k"]] == ["2", "1"]
    assert set(out) == {"cls", "s", "top_k"}


# ------------------------------------------------------------ passthrough
def test_passthrough_copies_every_output():
    op = Passthrough(dataclasses.replace(spec("tabular"), postprocess=Postprocess.parse({"type": "tensor"})))
    a = np.arange(4, dtype=np.float32)
    out = op({"a": a, "b": np.ones((2, 2), np.int64)}, {})
    assert set(out) == {"a", "b"}
    np.testing.assert_array_equal(out["a"], a)
    assert out["a"] is not a  # a copy: the shared-memory slot is freed right after
