"""Shadow traffic's pure parts: the setting, comparing two answers, tallies, the routing state holding it."""
from __future__ import annotations

import math

import numpy as np
import pytest

from aieng.frontend.rollout import routing
from aieng.frontend.rollout.rollout import Rollout
from aieng.frontend.rollout.routestore import RouteStore
from aieng.frontend.rollout.shadow import Tally, compare, cosine
from aieng.frontend.rollout.statewriter import StateWriter
from aieng.models import repo as model_repo
from aieng.models.routing import RoutingError, ShadowConfig, parse_shadow
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p

V = {"1", "2"}


def t(arr) -> dict:
    return p.encode_tensor(np.asarray(arr))


def test_parse_shadow_defaults_and_refusals():
    assert parse_shadow(None, V) is None
    assert parse_shadow({"version": 2, "percent": 10}, V) == ShadowConfig("2", 10.0, 0.5, 0)
    assert parse_shadow({"version": "2", "percent": 100, "max_load": 0.25, "timeout_ms": 900}, V) == \
        ShadowConfig("2", 100.0, 0.25, 900)
    for raw, why in [({"version": "3", "percent": 5}, "not served"), ({"version": "2"}, "percent"),
                     ({"version": "2", "percent": 101}, "percent"),
                     ({"version": "2", "percent": True}, "percent"),
                     ({"version": "2", "percent": 5, "max_load": 2}, "max_load"),
                     ({"version": "2", "percent": 5, "timeout_ms": -1}, "timeout_ms"),
                     ({"version": "2", "percent": 5, "extra": 1}, "takes"), ("2", "takes")]:
        with pytest.raises(RoutingError, match=why):
            parse_shadow(raw, V)


def test_identical_classifier_answers_agree_with_cosine_one_and_no_difference():
    out = {"label": "Adelie", "probabilities": t(np.array([0.7, 0.2, 0.1], np.float32))}
    c = compare(out, dict(out))
    assert (c.labels, c.agree, c.cosines, c.max_abs_diff, c.mismatches) == (1, 1, [1.0], 0.0, [])


def test_different_answers_give_the_known_cosine_diff_and_disagreement():
    a = {"label": "Adelie", "y": t(np.array([1.0, 0.0], np.float32))}
    b = {"label": "Gentoo", "y": t(np.array([1.0, 1.0], np.float32))}
    c = compare(a, b)
    assert (c.labels, c.agree, c.max_abs_diff) == (1, 0, 1.0)
    assert c.cosines == [pytest.approx(1 / math.sqrt(2))]


def test_int_tensors_and_numbers_get_a_diff_but_no_cosine():
    c = compare({"ids": t(np.array([1, 5], np.int64)), "n": 3},
                {"ids": t(np.array([1, 2], np.int64)), "n": 3.5})
    assert (c.cosines, c.max_abs_diff, c.mismatches) == ([], 3.0, [])


def test_shape_kind_or_missing_outputs_are_mismatches():
    a = {"y": t(np.zeros((2,), np.float32)), "label": "x", "only_a": 1, "ids": t(np.array([1], np.int64))}
    b = {"y": t(np.zeros((3,), np.float32)), "label": 7, "ids": t(np.array([1.0], np.float32))}
    assert compare(a, b).mismatches == ["ids", "label", "only_a", "y"]


def test_cosine_of_zero_vectors():
    z = np.zeros(3)
    assert (cosine(z, z), cosine(z, np.ones(3))) == (1.0, 0.0)


def test_tally_reports_counts_agreement_cosine_diff_and_latency_percentiles():
    tally = Tally()
    ones = {"label": "a", "y": t(np.ones(2, np.float32))}
    same = compare(ones, dict(ones))
    other = compare({"label": "a", "y": t(np.array([1.0, 0.0]))},
                    {"label": "b", "y": t(np.array([0.0, 1.0]))})
    for i in range(99):
        tally.add(same, 0.001 * (i + 1))
    tally.add(other, 1.0)
    tally.count("shed")
    tally.count("timeout")
    v = tally.view()
    assert (v["pairs"], v["shed"], v["outcomes"]["timeout"], v["label_pairs"]) == (100, 1, 1, 100)
    assert v["agreement"] == pytest.approx(0.99)
    assert (v["cosine_mean"], v["cosine_min"], v["max_abs_diff"]) == (pytest.approx(0.99), 0.0, 1.0)
    assert v["latency_delta_p50_s"] == pytest.approx(0.0505)
    assert v["latency_delta_p99_s"] > 0.099
    empty = Tally().view()
    assert (empty["agreement"], empty["cosine_mean"], empty["latency_delta_p50_s"]) == (None, None, None)


def test_routing_state_keeps_the_shadow_across_weight_changes_and_drops_it_on_off():
    conf = ShadowConfig("2", 10.0)
    s0 = routing.build(None, V, {"1": 100}, shadow=conf)
    s1 = routing.build(s0, V, {"1": 90, "2": 10})
    assert s1.shadow == conf and s1.public()["shadow"] == conf.public()
    assert routing.build(s1, V, shadow=None).shadow is None
    with pytest.raises(RoutingError, match="not served"):
        routing.build(s0, {"1"}, {"1": 100})


TENSOR_YAML = ("inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
               "preprocess: {type: tensor}\npostprocess: {type: tensor}\n")


def _repo(tmp_path, routing_yaml: str) -> str:
    repo = tmp_path / "repo"
    for v in ("1", "2"):
        d = repo / "m" / v
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.onnx").write_bytes(b"onnx " + v.encode())  # the scan only checks it exists
        (d / "model.yaml").write_text(TENSOR_YAML)
    (repo / "m" / "model.yaml").write_text(routing_yaml)
    return str(repo)


SHADOW_YAML = "routing:\n  weights: {'1': 100}\n  shadow: {version: '2', percent: 25}\n"


def _rollout(tmp_path) -> Rollout:
    specs = model_repo.scan(_repo(tmp_path, SHADOW_YAML))
    store = RouteStore(str(tmp_path / "state" / "routing.json"))
    return Rollout(ServedVersions(specs), store, StateWriter(store.save, store.path))


def test_a_malformed_shadow_in_model_yaml_is_refused_naming_the_file(tmp_path):
    repo = _repo(tmp_path, "routing:\n  shadow: {version: '9', percent: 25}\n")
    with pytest.raises(model_repo.ModelError, match="model.yaml: routing: shadow version '9'"):
        model_repo.scan(repo)


def test_shadow_from_model_yaml_and_a_run_time_change_survive_a_restart(tmp_path):
    ro = _rollout(tmp_path)
    m = ro.models["m"]
    assert m.state.shadow == ShadowConfig("2", 25.0)
    ro.change(m, routing.build(m.state, m.versions, shadow=ShadowConfig("2", 100.0, 0.1, 500)))
    ro.writer.close()  # writes what waits
    restarted = _rollout(tmp_path)
    restarted.writer.close()
    again = restarted.models["m"]
    assert again.state.shadow == ShadowConfig("2", 100.0, 0.1, 500)
    assert again.history[-1].shadow == ShadowConfig("2", 25.0)  # rollback brings the old setting back
