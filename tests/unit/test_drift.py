"""Drift for every model: the features preprocessing reports, references built from a sample, PSI,
the embedding's distance to its golden centroid, and the saved references' round trip."""
import dataclasses
import json
import os
import random

import numpy as np
import pytest
from tokenizers import Tokenizer

from aieng.frontend.observe.drift import DriftMonitor, ReferenceRule
from aieng.frontend.observe.driftref import Binned, build, psi
from aieng.frontend.observe.driftstore import DriftStore, drift_path
from aieng.models.repo import load_spec
from aieng.models.served import ServedVersions
from aieng.processing.post.centroid import Centroid
from aieng.processing.pre.features import image_features, text_features
from tests.conftest import ROOT

MODELS = os.path.join(ROOT, "models")


@pytest.fixture(scope="module")
def tok():
    t = Tokenizer.from_file(os.path.join(MODELS, "minilm", "1", "tokenizer.json"))
    t.no_padding()
    return t


def test_out_of_vocabulary_share_is_high_for_made_up_words_and_zero_for_plain_english(tok):
    unk = tok.token_to_id("[UNK]")
    plain = text_features(tok.encode("The cat sat on the mat near the window."), unk)
    made_up = text_features(tok.encode("Zorblax quendril fimbuxt snargle wuvvel pligrot."), unk)
    assert plain == {"tokens": 12, "oov_share": 0.0}
    assert made_up["oov_share"] > 0.8 and made_up["tokens"] > plain["tokens"]


def test_a_token_mapped_to_unk_counts_as_out_of_vocabulary(tok):
    unk = tok.token_to_id("[UNK]")
    enc = tok.encode("hello \U0001F9FF")  # the nazar amulet is not in BERT's vocabulary
    assert unk in enc.ids
    assert text_features(enc, unk)["oov_share"] == 0.5


def test_image_features_size_aspect_and_brightness():
    dark = np.full((100, 400, 3), 10, np.uint8)
    bright = np.full((300, 300, 3), 240, np.uint8)
    assert image_features(dark) == {"width": 400, "height": 100, "aspect": 4.0, "brightness": 10.0}
    assert image_features(bright) == {"width": 300, "height": 300, "aspect": 1.0, "brightness": 240.0}
    half = np.zeros((2000, 3000, 3), np.uint8)
    half[:, 1500:] = 200  # a big page: the grid sample still sees both halves
    assert abs(image_features(half)["brightness"] - 100.0) < 5.0


def test_a_reference_built_from_a_sample_has_quantile_edges_and_proportions_summing_to_one():
    rng = random.Random(0)
    values = [rng.uniform(0, 100) for _ in range(1000)]
    ref = build(values)
    edges = ref["edges"]
    assert len(edges) == 11 and edges == sorted(edges) and edges[0] < min(values) and edges[-1] > max(values)
    for edge, q in zip(edges[1:-1], range(10, 100, 10)):
        assert abs(edge - q) < 5.0, (edge, q)
        assert edge not in values  # halfway between two sample values: a value a few ulps off keeps its bin
    assert abs(sum(ref["proportions"]) - 1.0) < 1e-9
    props = ref["proportions"]
    assert props[0] == props[-1] == 0.0 and all(abs(p - 0.1) < 0.01 for p in props[1:-1])
    few = build([3, 3, 3, 5, 5, 7] * 10)  # few distinct values: fewer bins, no empty duplicates
    assert few["edges"] == [3 - 3e-3, 4.0, 6.0, 7 + 7e-3]
    assert abs(sum(few["proportions"]) - 1.0) < 1e-9
    cats = build(["Dream"] * 60 + ["Biscoe"] * 40)
    assert cats["categories"] == ["Biscoe", "Dream"] and cats["proportions"] == [0.4, 0.6, 0.0]
    assert build([None, None]) is None


def test_psi_of_the_same_distribution_is_near_zero_and_of_a_shifted_one_above_a_quarter():
    rng = random.Random(1)
    ref = build([rng.gauss(10, 2) for _ in range(2000)])
    same, shifted = Binned(ref, 1000), Binned(ref, 1000)
    for _ in range(1000):
        same.observe(rng.gauss(10, 2))
        shifted.observe(rng.gauss(13, 2))
    assert same.psi() < 0.05
    assert shifted.psi() > 0.25
    assert psi([0.5, 0.5], [0.5, 0.5]) == 0.0
    window = Binned(ref, 100)  # the counts follow the window as it moves
    for i in range(250):
        window.observe(rng.gauss(10, 2) if i < 150 else rng.gauss(13, 2))
    assert window.counts == [list(window.recent).count(b) for b in range(len(window.expected))]
    assert sum(window.counts) == 100 and window.psi() > 0.25
    constant = Binned(build([0.0] * 100), 100)  # a feature always 0 (English: no word out of vocabulary)
    for _ in range(100):
        constant.observe(0.8)
    assert constant.psi() > 0.25
    few = Binned(ref, 1000)
    for _ in range(10):
        few.observe(10.0)
    assert few.psi() is None  # too few observations to score


def test_the_embedding_distance_to_the_golden_centroid():
    spec = load_spec("minilm", "1", os.path.join(MODELS, "minilm", "1"))
    c = Centroid(spec, "embedding")
    assert c.vector is not None and abs(np.linalg.norm(c.vector) - 1.0) < 1e-9
    assert abs(c.distance(c.vector.astype(np.float32))) < 1e-6
    assert abs(c.distance(-c.vector) - 2.0) < 1e-6
    orientation = load_spec("orientation", "1", os.path.join(MODELS, "orientation", "1"))
    assert Centroid(orientation, "embedding").vector is None


def spec_dicts() -> dict:
    return {name: {v: load_spec(name, v, os.path.join(MODELS, name, v)) for v in versions}
            for name, versions in (("minilm", ("1", "2")), ("orientation", ("1",)), ("tabular", ("1",)))}


def spec_table() -> ServedVersions:
    return ServedVersions(spec_dicts())


def test_a_version_without_reference_file_collects_its_first_n_answers_then_scores_and_saves(tmp_path):
    saved = []
    mon = DriftMonitor(spec_table(), window=200, reference_n=100, persist=saved.append)
    rng = random.Random(2)
    for i in range(99):
        mon.observe("orientation", "1", {"width": 640, "height": 480, "aspect": 1.333,
                                         "brightness": rng.uniform(100, 160)}, rng.uniform(0.7, 1.0))
    ref = mon.view()["orientation"]["1"]["reference"]
    assert (ref["state"], ref["collected"], ref["size"], ref["input"]) == ("collecting", 99, 100, "traffic")
    assert saved == []
    mon.observe("orientation", "1", {"width": 640, "height": 480, "aspect": 1.333, "brightness": 130.0}, 0.9)
    assert mon.view()["orientation"]["1"]["reference"]["state"] == "ready"
    (refs,) = saved
    built = refs["orientation:1"]
    assert set(built["inputs"]) == {"width", "height", "aspect", "brightness"}
    assert set(built["outputs"]) == {"confidence"}  # no distance: not an embedding model
    for _ in range(100):
        mon.observe("orientation", "1", {"width": 640, "height": 480, "aspect": 1.333,
                                         "brightness": rng.uniform(0, 20)}, rng.uniform(0.3, 0.5))
    scores = mon.view()["orientation"]["1"]["psi"]
    assert scores["input"]["brightness"] > 0.25 and scores["output"]["confidence"] > 0.25
    assert scores["input"]["width"] < 0.1
    # tabular's inputs come from its file and score from the first request; its outputs are collected
    tab = mon.view()["tabular"]["1"]["reference"]
    assert (tab["input"], tab["output"], tab["state"]) == ("file", "traffic", "collecting")
    assert mon.view()["minilm"]["1"]["reference"]["centroid"] == "golden"


def test_saved_references_round_trip_and_a_changed_version_starts_a_new_one(tmp_path):
    store = DriftStore(drift_path(str(tmp_path), MODELS))
    mon = DriftMonitor(spec_table(), window=200, reference_n=60, persist=store.save)
    for i in range(60):
        mon.observe("minilm", "1", {"tokens": 8 + i % 5, "oov_share": 0.0}, None, 0.6 + (i % 10) / 100)
    assert os.path.basename(store.path).startswith("drift-") and os.path.isfile(store.path)
    again = DriftMonitor(spec_table(), window=200, reference_n=60, saved=store.load())
    ref = again.view()["minilm"]["1"]["reference"]
    assert (ref["state"], ref["collected"]) == ("ready", 60)
    assert again.versions[("minilm", "1")].outputs["distance"].ref == \
        mon.versions[("minilm", "1")].outputs["distance"].ref
    assert again.view()["minilm"]["2"]["reference"]["state"] == "collecting"  # its own reference
    specs = spec_dicts()
    # new files under the same version: a new reference
    specs["minilm"]["1"] = dataclasses.replace(specs["minilm"]["1"], content_hash="0" * 64)
    changed = DriftMonitor(ServedVersions(specs), window=200, reference_n=60, saved=store.load())
    assert changed.view()["minilm"]["1"]["reference"]["state"] == "collecting"


def test_an_unreadable_store_is_no_reference_yet(tmp_path):
    path = tmp_path / "drift-x.json"
    path.write_text("{not json")
    assert DriftStore(str(path)).load() == {}
    assert DriftStore(str(tmp_path / "missing.json")).load() == {}


def test_one_client_gives_at_most_its_share_and_the_reference_needs_enough_clients():
    rule = ReferenceRule(clients=4, span_s=0.0)
    mon = DriftMonitor(spec_table(), window=200, reference_n=40, rule=rule)
    for i in range(200):  # one client, however many answers: 10 of the 40
        mon.observe("orientation", "1", {"brightness": 5.0}, 0.99, client="10.0.0.1", now=float(i))
    ref = mon.view()["orientation"]["1"]["reference"]
    assert (ref["state"], ref["collected"], ref["clients"], ref["client_share"]) == ("collecting", 10, 1, 10)
    for j, c in enumerate(("10.0.0.2", "10.0.0.3", "10.0.0.4")):
        for i in range(10):
            mon.observe("orientation", "1", {"brightness": 120.0 + i}, 0.8, client=c, now=300.0 + 10 * j + i)
    ref = mon.view()["orientation"]["1"]["reference"]
    assert (ref["state"], ref["collected"], ref["clients"]) == ("ready", 40, 4)


def test_answers_are_taken_no_faster_than_the_span_allows():
    rule = ReferenceRule(clients=1, span_s=99.0)  # 100 answers: one a second at most
    mon = DriftMonitor(spec_table(), window=200, reference_n=100, rule=rule)
    for i in range(1000):  # ten a second for 100 s: the last one taken at 99 s
        mon.observe("orientation", "1", {"brightness": 100.0}, 0.9, client=f"c{i % 7}", now=i / 10)
    ref = mon.view()["orientation"]["1"]["reference"]
    assert (ref["state"], ref["collected"]) == ("ready", 100)
    assert mon.saved["orientation:1"]["span_s"] >= 99.0


def test_a_saved_reference_built_before_the_rule_or_by_too_few_clients_is_collected_again(tmp_path):
    store = DriftStore(drift_path(str(tmp_path), MODELS))
    mon = DriftMonitor(spec_table(), window=200, reference_n=60, persist=store.save)
    for i in range(60):  # the old way: one client
        mon.observe("minilm", "1", {"tokens": 8 + i % 5, "oov_share": 0.0}, None, 0.6)
    old = store.load()
    assert old["minilm:1"]["clients"] == 1
    strict = DriftMonitor(spec_table(), window=200, reference_n=60, saved=old,
                          rule=ReferenceRule(clients=3, span_s=0.0))
    assert strict.view()["minilm"]["1"]["reference"]["state"] == "collecting"
    del old["minilm:1"]["clients"], old["minilm:1"]["span_s"]  # saved before provenance was recorded
    loose = DriftMonitor(spec_table(), window=200, reference_n=60, saved=old)
    assert loose.view()["minilm"]["1"]["reference"]["state"] == "collecting"


@pytest.mark.parametrize("text", [
    '{"format": 1, "references": {',
    '{"format": 1, "references": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"format": 1, "references": {"m:1": {"digest": "d", "size": [1], "inputs": {}, "outputs": {}}}}',
    '{"format": 1, "references": {"m:1": {"digest": "d", "size": 1, "inputs": "x", "outputs": {}}}}',
    '{"format": 1, "references": {"m:1": {"digest": "d", "size": 1, "inputs": {}, "outputs": '
    '{"confidence": {"edges": [0.5], "proportions": ["x", "y"]}}}}}',
    '{"format": 1, "references": {"m:1": {"digest": "d", "size": 1, "inputs": {}, "outputs": '
    '{"confidence": {"edges": [0.5, 0.1], "proportions": [0.2, 0.3, 0.5]}}}}}',
])
def test_a_corrupt_store_or_reference_is_dropped_not_raised(tmp_path, text):
    path = tmp_path / "drift-x.json"
    path.write_text(text)
    assert DriftStore(str(path)).load() == {}


def test_a_versions_own_reference_file_that_cannot_be_used_is_logged_and_built_from_traffic(tmp_path, caplog):
    from aieng.frontend.observe.drift import read_reference_file

    good = {"features": {"x": {"edges": [1.0], "proportions": [0.5, 0.5]}}}
    (tmp_path / "good.json").write_text(json.dumps(good))
    assert read_reference_file(str(tmp_path / "good.json"), "m:1") == good
    bad = {"not json": "{", "deep": "[" * 100_000, "list": "[1, 2]",
           "shape": json.dumps({"features": {"x": {"edges": [1.0, 2.0], "proportions": [1.0]}}}),
           "types": json.dumps({"features": ["x"]})}
    for name, text in bad.items():
        (tmp_path / f"{name}.json").write_text(text)
    os.mkfifo(tmp_path / "fifo.json")  # no writer: a blocking open would never return
    names = [*bad, "fifo", "missing"]
    with caplog.at_level("ERROR", logger="aieng.frontend.observe.drift"):
        got = [read_reference_file(str(tmp_path / f"{name}.json"), "m:1") for name in names]
    assert got == [None] * len(names)
    assert len([r for r in caplog.records if "built from traffic instead" in r.getMessage()]) == len(names)
