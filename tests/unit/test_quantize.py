"""Pure parts of ``aieng quantize`` and ``aieng.tools.parity``: version naming, tolerances and their check,
metrics, batch stacking, the new model.yaml, and the sample inputs going through the server's own
preprocessing."""
from __future__ import annotations

import numpy as np
import pytest

from aieng.models.repo import ModelSpec
from aieng.models.sections import Batching, Padding, Postprocess, Preprocess
from aieng.tools import parity
from aieng.tools.quantize import new_model_yaml, next_version
from tests.unit.demo import needs_demo_models, spec


def _spec(post: dict | None = None, padding: dict | None = None) -> ModelSpec:
    return ModelSpec(name="m", version="1", path="/nowhere", content_hash="ab" * 32, description="d",
                     inputs=(), outputs=(), preprocess=Preprocess.parse({"type": "tensor"}),
                     postprocess=Postprocess.parse(post or {"type": "tensor"}),
                     padding=Padding.parse(padding),
                     batching=Batching(max_batch_size=8), timeout_ms=0)


def test_next_version_counts_every_numeric_entry(tmp_path):
    assert next_version(str(tmp_path / "absent")) == "1"
    for name in ("1", "2", "10", "beta", ".quantize-x"):
        (tmp_path / name).mkdir()
    assert next_version(str(tmp_path)) == "11"  # numeric order, names ignored, a yaml-less dir counts


def test_tolerances_defaults_then_model_yaml_then_command_line():
    assert parity.resolve_tolerances({}, {}) == parity.DEFAULT_TOLERANCES
    tol = parity.resolve_tolerances({"quantize": {"min_top1": 0.5, "max_abs_diff": 0.1}},
                                    {"min_top1": 0.9, "min_cosine": None, "max_abs_diff": None})
    assert tol == {"min_cosine": 0.99, "min_top1": 0.9, "max_abs_diff": 0.1}


@pytest.mark.parametrize("cfg, cli, message", [
    ({"quantize": {"min_top": 1}}, {}, "unknown tolerance 'min_top'"),
    ({"quantize": {"min_top1": "high"}}, {}, "must be a number"),
    ({"quantize": [1]}, {}, "must be a mapping"),
])
def test_bad_tolerances_are_refused(cfg, cli, message):
    with pytest.raises(ValueError, match=message):
        parity.resolve_tolerances(cfg, cli)


def test_check_names_each_failing_metric_and_the_shortfall():
    metrics = {"scores": {"metric": "top1", "top1": 0.75, "min_cosine": 0.5, "max_abs_diff": 0.2},
               "emb": {"metric": "cosine", "min_cosine": 0.98, "max_abs_diff": 0.01}}
    tol = {"min_top1": 0.95, "min_cosine": 0.99, "max_abs_diff": 0.1}
    assert parity.check(metrics, tol) == [
        "scores: top-1 agreement 0.7500 < 0.95 (short by 0.2000)",
        "scores: max abs diff 0.2 > 0.1 (over by 0.1)",
        "emb: cosine 0.980000 < 0.99 (short by 0.010000)",
    ]
    assert parity.check(metrics, {"min_top1": 0.75, "min_cosine": 0.98, "max_abs_diff": None}) == []


def test_compare_top1_for_the_classifier_output_and_cosine_for_others():
    s = _spec(post={"type": "classify", "source": "scores"})
    ref = [{"scores": np.array([0.9, 0.1]), "emb": np.array([1.0, 0.0])},
           {"scores": np.array([0.2, 0.8]), "emb": np.array([0.0, 1.0])}]
    new = [{"scores": np.array([0.6, 0.4]), "emb": np.array([1.0, 1.0])},
           {"scores": np.array([0.7, 0.3]), "emb": np.array([0.0, 2.0])}]
    m = parity.compare(s, ref, new)
    assert m["scores"]["metric"] == "top1" and m["scores"]["top1"] == 0.5
    assert m["scores"]["max_abs_diff"] == pytest.approx(0.5)
    assert m["emb"]["metric"] == "cosine" and "top1" not in m["emb"]
    assert m["emb"]["min_cosine"] == pytest.approx(2 ** -0.5) and m["emb"]["mean_cosine"] < 1.0


def test_stack_pads_variable_axes_with_the_models_padding():
    s = _spec(padding={"ids": 7})
    batch = parity.stack(s, [{"ids": np.array([1, 2, 3])}, {"ids": np.array([4])}])["ids"]
    assert batch.tolist() == [[1, 2, 3], [4, 7, 7]]


def test_new_model_yaml_notes_the_conversion():
    s = _spec()
    out = new_model_yaml({"description": "clf", "inputs": []}, s, "int8", "static")
    assert out["description"] == "clf [static int8 quantization of version 1]"
    assert out["converted_from"] == {"version": "1", "hash": "ab" * 32, "to": "int8", "method": "static"}
    assert out["inputs"] == []


@needs_demo_models
def test_orientation_samples_go_through_the_servers_preprocessing():
    orient = spec("orientation")
    reqs = parity.sample_requests(orient, 8)
    assert reqs == parity.sample_requests(orient, 8)  # deterministic
    assert reqs[0] != parity.sample_requests(orient, 8, start=8)[0]  # calibration samples differ
    feeds = parity.sample_feeds(orient, reqs)
    assert [f["x"].shape for f in feeds] == [(3, 224, 224)] * 8
    assert all(f["x"].dtype == np.float32 for f in feeds)


@needs_demo_models
def test_text_and_tabular_samples():
    text = parity.sample_feeds(spec("minilm"), parity.sample_requests(spec("minilm"), 3))
    assert set(text[0]) == {"input_ids", "attention_mask", "token_type_ids"}
    tab_spec = spec("tabular")
    rows = parity.sample_feeds(tab_spec, parity.sample_requests(tab_spec, 4))
    assert len(rows) == 4 and rows[0]["features"].ndim == 1
