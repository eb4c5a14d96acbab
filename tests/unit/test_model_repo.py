"""Unit tests for aieng/models/repo.py: model.yaml parsing, path confinement, hashes."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from aieng.models import repo as model_repo
from aieng.models.repo import ModelError, apply_overrides, resolve_inside, scan
from aieng.models.sections import Batching

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
HEX64 = re.compile(r"^[0-9a-f]{64}$")

# Only the tests that read the demo models need them (the path-confinement and empty-repository
# tests need nothing): all three for a scan of the whole repository, tabular for ``repo`` copies.
_MISSING = "demo models missing: run scripts/fetch_models.py"
needs_demo_models = pytest.mark.skipif(
    not all((MODELS / name / "1" / "model.onnx").is_file() for name in ("minilm", "orientation", "tabular")),
    reason=_MISSING)
needs_tabular = pytest.mark.skipif(not (MODELS / "tabular/1/model.onnx").is_file(), reason=_MISSING)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A private repository holding a copy of the (small) tabular model."""
    dst = tmp_path / "repo"
    shutil.copytree(MODELS / "tabular" / "1", dst / "tabular" / "1")  # version 1 only (2 is a demo candidate)
    return dst


def edit_yaml(vdir: Path, change) -> None:
    path = vdir / "model.yaml"
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(cfg)
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")


# ------------------------------------------------------------ resolve_inside
def test_resolve_inside_accepts_inside_paths(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("a")
    real = os.path.realpath(tmp_path)
    assert resolve_inside(str(tmp_path), "a.txt") == os.path.join(real, "a.txt")
    assert resolve_inside(str(tmp_path), "sub/../a.txt") == os.path.join(real, "a.txt")
    assert resolve_inside(str(tmp_path), "sub/new.bin") == os.path.join(real, "sub", "new.bin")


@pytest.mark.parametrize("rel", ["../x", "../../etc/passwd", "sub/../../x", "/etc/passwd", "", None, 3])
def test_resolve_inside_refuses_escapes(tmp_path, rel):
    (tmp_path / "sub").mkdir()
    with pytest.raises(ModelError):
        resolve_inside(str(tmp_path), rel)


def test_resolve_inside_refuses_sibling_with_common_prefix(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model2").mkdir()
    with pytest.raises(ModelError):
        resolve_inside(str(tmp_path / "model"), "../model2/x")


def test_resolve_inside_refuses_escaping_symlinks(tmp_path):
    root = tmp_path / "v1"
    root.mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (root / "link.txt").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    (root / "inner.txt").write_text("ok")
    (root / "good_link.txt").symlink_to(root / "inner.txt")
    with pytest.raises(ModelError):
        resolve_inside(str(root), "link.txt")
    with pytest.raises(ModelError):
        resolve_inside(str(root), "dirlink/secret.txt")
    assert resolve_inside(str(root), "good_link.txt") == os.path.realpath(root / "inner.txt")


def test_resolve_inside_through_symlinked_root(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_text("x")
    (tmp_path / "alias").symlink_to(real)
    assert resolve_inside(str(tmp_path / "alias"), "f") == os.path.realpath(real / "f")


# ------------------------------------------------------------ scan + hashes
@needs_demo_models
def test_scan_finds_demo_models_with_stable_hashes():
    first = scan(str(MODELS))
    assert set(first) == {"minilm", "orientation", "tabular", "layout", "textdet", "textrec", "ocr"}
    assert first["ocr"]["1"].pipeline is not None and first["ocr"]["1"].onnx_path == ""  # a pipeline
    for name, versions in first.items():
        if name == "ocr":
            continue
        assert set(versions) == {"1"}
        spec = versions["1"]
        assert spec.name == name and spec.version == "1" and spec.key == f"{name}:1"
        assert HEX64.match(spec.content_hash)
        assert os.path.isfile(spec.onnx_path) and spec.onnx_path.startswith(spec.path)
    assert len({v["1"].content_hash for v in first.values()}) == len(first)
    second = scan(str(MODELS))
    hashes = {n: v["1"].content_hash for n, v in first.items()}
    assert hashes == {n: v["1"].content_hash for n, v in second.items()}


def test_a_pipeline_is_checked_at_scan(tmp_path):
    for name in ("textdet", "textrec"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.yaml").write_text(
            "inputs: [{name: image, kind: image}]\noutputs: []\npreprocess: {type: image}\n"
            "postprocess: {type: tensor}\n")
        (tmp_path / name / "1" / "model.onnx").write_bytes(b"x")
    (tmp_path / "ocr" / "1").mkdir(parents=True)
    good = ("kind: pipeline\ninputs: [{name: image, kind: image}]\noutputs: []\nsteps:\n"
            "  - {step: textdet, model: textdet}\n  - {step: crop, max_crops: 10}\n"
            "  - {step: textrec, model: textrec}\n  - {step: join}\n")
    (tmp_path / "ocr" / "1" / "model.yaml").write_text(good)
    spec = scan(str(tmp_path))["ocr"]["1"]
    assert spec.pipeline.public()[1] == {"step": "crop", "max_crops": 10, "rotate_ratio": 1.5}
    assert spec.pipeline.public()[3] == {"step": "join", "min_score": 0.5}
    with pytest.raises(ModelError, match="names model 'textrec', which is not served"):
        scan(str(tmp_path), only=["textdet", "ocr"])
    (tmp_path / "ocr" / "1" / "model.yaml").write_text(good.replace("max_crops: 10", "max_crops: 0"))
    with pytest.raises(ModelError, match="step crop: 'max_crops' must be an int in 1..10000"):
        scan(str(tmp_path))
    (tmp_path / "ocr" / "1" / "model.yaml").write_text(good.replace("  - {step: join}\n", ""))
    with pytest.raises(ModelError, match="steps must be textdet, crop, textrec, join"):
        scan(str(tmp_path))


@needs_tabular
def test_scan_only_and_missing():
    assert set(scan(str(MODELS), only=["tabular"])) == {"tabular"}
    with pytest.raises(ModelError, match="nope"):
        scan(str(MODELS), only=["tabular", "nope"])


def test_scan_empty_or_missing_repository(tmp_path):
    with pytest.raises(ModelError):
        scan(str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no models"):
        scan(str(tmp_path / "empty"))


@needs_demo_models
def test_demo_specs_parse_as_documented():
    specs = scan(str(MODELS))
    minilm, orient, tab = specs["minilm"]["1"], specs["orientation"]["1"], specs["tabular"]["1"]
    assert minilm.preprocess.type == "text" and minilm.batching.max_batch_size == 32
    assert dict(minilm.padding.values) == {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}
    # max_padding_waste is not in orientation's model.yaml: the default applies.
    assert orient.batching == Batching(max_batch_size=16, max_wait_ms=2, max_padding_waste=0.3)
    assert tab.timeout_ms == 5000 and all(i.optional for i in tab.inputs)
    pub = tab.public()
    assert pub["hash"] == tab.content_hash and pub["max_batch_size"] == 64 and pub["version"] == "1"
    again = model_repo.ModelSpec.from_dict(tab.to_dict())
    assert again == tab


@needs_tabular
def test_hash_changes_with_content_and_names(repo):
    vdir = repo / "tabular" / "1"
    h0 = scan(str(repo))["tabular"]["1"].content_hash
    assert scan(str(repo))["tabular"]["1"].content_hash == h0
    # The hash does not depend on where the directory is.
    assert h0 == scan(str(MODELS), only=["tabular"])["tabular"]["1"].content_hash

    labels = vdir / "labels.json"
    original = labels.read_bytes()
    labels.write_bytes(original.replace(b"Adelie", b"Adelia"))
    h1 = scan(str(repo))["tabular"]["1"].content_hash
    assert h1 != h0
    labels.write_bytes(original)
    assert scan(str(repo))["tabular"]["1"].content_hash == h0

    (vdir / "notes.txt").write_text("")  # an extra (even empty) file counts
    h2 = scan(str(repo))["tabular"]["1"].content_hash
    assert h2 not in (h0, h1)
    (vdir / "notes.txt").rename(vdir / "notes2.txt")  # so does a name
    assert scan(str(repo))["tabular"]["1"].content_hash not in (h0, h1, h2)


@needs_tabular
def test_versions_and_latest(repo):
    for ver in ("2", "10"):
        shutil.copytree(repo / "tabular" / "1", repo / "tabular" / ver)
    (repo / "tabular" / "notes").mkdir()  # no model.yaml: not a version
    (repo / ".hidden").mkdir()
    versions = scan(str(repo))["tabular"]
    assert list(versions) == ["1", "2", "10"]
    assert model_repo.latest(versions) == "10"


# ------------------------------------------------------------ bad model.yaml
@needs_tabular
@pytest.mark.parametrize("change, match", [
    (lambda c: c["inputs"].append({"name": "clip", "kind": "video"}), "kind"),
    (lambda c: c["inputs"].append({"kind": "number"}), "name"),
    (lambda c: c["inputs"].append("bill_length_mm"), "input"),
    (lambda c: c["outputs"].append({"name": "x", "kind": "blob"}), "output"),
    (lambda c: c.pop("inputs"), "inputs"),
    (lambda c: c.__setitem__("outputs", {"name": "x"}), "outputs"),
    (lambda c: c.pop("preprocess"), "preprocess"),
    (lambda c: c["postprocess"].pop("type"), "type"),
    (lambda c: c.__setitem__("batching", {"max_batch_size": 0}), "max_batch_size"),
    (lambda c: c.__setitem__("batching", {"max_batch_size": "8"}), "max_batch_size"),
    (lambda c: c.__setitem__("model_file", "../1/../../other/1/model.onnx"), "outside"),
    (lambda c: c.__setitem__("model_file", "/etc/passwd"), "relative"),
    (lambda c: c.__setitem__("model_file", "missing.onnx"), "missing"),
], ids=["bad-input-kind", "input-no-name", "input-not-map", "bad-output-kind", "no-inputs",
        "outputs-not-list", "no-preprocess", "no-post-type", "batch-0", "batch-str",
        "model-file-escape", "model-file-abs", "model-file-missing"])
def test_bad_model_yaml_raises_model_error(repo, change, match):
    edit_yaml(repo / "tabular" / "1", change)
    with pytest.raises(ModelError, match=match):
        scan(str(repo))


@needs_tabular
def test_unparseable_or_non_mapping_yaml(repo):
    path = repo / "tabular" / "1" / "model.yaml"
    path.write_text("inputs: [unclosed\n", encoding="utf-8")
    with pytest.raises(ModelError):
        scan(str(repo))
    path.write_text("- a list\n", encoding="utf-8")
    with pytest.raises(ModelError, match="mapping"):
        scan(str(repo))


@needs_tabular
def test_spec_file_is_confined(repo):
    spec = scan(str(repo))["tabular"]["1"]
    assert spec.file("labels.json") == os.path.join(spec.path, "labels.json")
    with pytest.raises(ModelError):
        spec.file("../1/../labels.json")


# ------------------------------------------------------------ overrides
@needs_tabular
def test_apply_overrides(repo):
    shutil.copytree(MODELS / "tabular", repo / "other")
    specs = scan(str(repo))
    before = {n: v["1"].batching for n, v in specs.items()}
    apply_overrides(specs, max_batch_size=0, max_wait_ms=-1.0)  # "not set"
    assert {n: v["1"].batching for n, v in specs.items()} == before

    apply_overrides(specs, max_batch_size=4, max_wait_ms=0.0)  # 0 ms is a real override
    for versions in specs.values():
        b = versions["1"].batching
        assert (b.max_batch_size, b.max_wait_ms, b.max_padding_waste) == (4, 0.0, 0.3)
        assert versions["1"].public()["max_batch_size"] == 4

    apply_overrides(specs, max_batch_size=2, max_wait_ms=-1.0)
    assert all(v["1"].batching.max_batch_size == 2 and v["1"].batching.max_wait_ms == 0.0
               for v in specs.values())
