"""A model the start leaves out (its description does not load, ``--no-exit-on-error``): the scan's record
(``VersionRecord.left_out``), its way to every child (``Config.left_out``), the frontend's merge into
``failed_models`` and the gateway's catalog entry.  End to end: tests/e2e/test_left_out.py."""
from __future__ import annotations

import msgpack
import pytest

from aieng.config import INTERNAL, Config, LeftOut, load_config
from aieng.frontend.control.workers import Workers
from aieng.gateway import models
from aieng.models.spec import ModelError
from aieng.runtime.versions import VersionRecord
from aieng.wire import messages as m
from tests.onnx_files import save_add


def repository(tmp_path):
    save_add(tmp_path / "good" / "1", ["batch", 4])
    (tmp_path / "garbage" / "1").mkdir(parents=True)
    (tmp_path / "garbage" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    return str(tmp_path)


def test_a_scan_that_is_not_strict_keeps_what_it_left_out_and_why(tmp_path):
    record = VersionRecord.scan(repository(tmp_path), "", 0, 0.0, strict=False)
    assert list(record.specs) == ["good:1"]
    [lo] = record.left_out
    assert lo.name == "garbage" and lo.error.startswith(f"model garbage ({tmp_path}/garbage): ")
    assert "not a readable ONNX model" in lo.error


def test_a_strict_scan_still_fails_naming_the_model(tmp_path):
    with pytest.raises(ModelError, match="garbage/1/model.onnx: not a readable ONNX model"):
        VersionRecord.scan(repository(tmp_path), "", 0, 0.0)


def test_a_pipeline_over_a_model_left_out_is_left_out_too(tmp_path):
    """One model's failure stays its own: the pipeline that needs it is left out, saying which step."""
    for name in ("textdet", "textrec"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.yaml").write_text(
            "inputs: [{name: image, kind: image}]\noutputs: []\npreprocess: {type: image}\n"
            "postprocess: {type: tensor}\n")
        (tmp_path / name / "1" / "model.onnx").write_bytes(b"x")
    (tmp_path / "textrec" / "1" / "model.yaml").write_text("inputs: [[[\n")  # its description: unreadable
    (tmp_path / "ocr" / "1").mkdir(parents=True)
    (tmp_path / "ocr" / "1" / "model.yaml").write_text(
        "kind: pipeline\ninputs: [{name: image, kind: image}]\noutputs: []\nsteps:\n"
        "  - {step: textdet, model: textdet}\n  - {step: crop, max_crops: 10}\n"
        "  - {step: textrec, model: textrec}\n  - {step: join}\n")
    record = VersionRecord.scan(str(tmp_path), "", 0, 0.0, strict=False)
    assert list(record.specs) == ["textdet:1"]
    why = {lo.name: lo.error for lo in record.left_out}
    assert sorted(why) == ["ocr", "textrec"]
    assert why["ocr"].startswith(f"model ocr ({tmp_path}/ocr): ") and "names model 'textrec'" in why["ocr"]
    with pytest.raises(ModelError, match="textrec/1/model.yaml"):
        VersionRecord.scan(str(tmp_path), "", 0, 0.0)


def test_the_record_crosses_to_every_child_typed():
    cfg = Config(left_out=(LeftOut("garbage", "model garbage (/r/garbage): unreadable"),))
    # the spawn's form: the config as a plain map, as msgpack carries it to the child
    wire = msgpack.unpackb(msgpack.packb(cfg.to_dict()), raw=False)
    assert wire["left_out"] == [{"name": "garbage", "error": "model garbage (/r/garbage): unreadable"}]
    assert Config.from_dict(wire).left_out == cfg.left_out
    assert Config.from_dict(Config().to_dict()).left_out == ()


def test_left_out_is_the_supervisors_never_a_setting(tmp_path):
    assert "left_out" in INTERNAL
    path = tmp_path / "aieng.yaml"
    path.write_text("left_out: []\n")
    with pytest.raises(ValueError, match="unknown setting 'left_out'"):
        load_config(str(path), environ={})


def hello(failed: dict[str, str]) -> m.Hello:
    return m.Hello("executor", "executor", 1, failed=failed)


def test_failed_models_holds_failed_builds_by_version_and_left_out_models_by_name():
    w = Workers((LeftOut("garbage", "why g"),))
    assert w.failed_models() == {"garbage": "why g"}
    w.hello(hello({"tab:2": "session: out of memory"}), 0.0)
    assert w.failed_models() == {"garbage": "why g", "tab:2": "session: out of memory"}
    assert w.left_out_models() == {"garbage": "why g"}
    w.now_served("garbage")  # loaded at run time once its files were fixed
    assert w.failed_models() == {"tab:2": "session: out of memory"} and w.left_out_models() == {}
    assert Workers().failed_models() == {}


def test_a_run_time_load_that_passes_takes_the_model_off_the_supervisors_list(tmp_path):
    record = VersionRecord.scan(repository(tmp_path), "", 0, 0.0, strict=False)
    save_add(tmp_path / "garbage" / "1", ["batch", 4])  # fixed
    [spec] = VersionRecord.scan(str(tmp_path), "garbage", 0, 0.0).specs.values()
    record.on_load(m.LoadVersion(spec))  # pending: a restarted child is still told it is left out
    assert [lo.name for lo in record.left_out] == ["garbage"] and "garbage:1" in record.pending
    record.on_load(m.LoadVersion(spec, ready=True))
    assert record.left_out == () and "garbage:1" in record.for_child(True)


def test_the_gateway_catalog_shows_a_left_out_model_for_any_version_never_ready():
    cat = models.Catalog()
    pub = {"version": "1", "inputs": [], "outputs": [], "max_batch_size": 1, "load_error": None}
    cat.update({"good": {"default_version": "1", "versions": {"1": pub}},
                "garbage": {"default_version": None, "weights": {}, "versions": {}, "load_error": "why g"}})
    assert list(cat.views) == ["good"]  # stats and the index walk the served versions only
    assert cat.left_out == {"garbage": "why g"}
    for version in (None, "1", "7"):
        view = cat.get("garbage", version)
        assert view.left_out and view.load_error == "why g" and view.inputs == []
        text = models.not_ready(view, version)
        assert text.startswith("Request for unknown model: 'garbage' ") and text.endswith(": why g")
    assert not cat.get("good", None).left_out and cat.get("nope", None) is None
    cat.update({"good": {"default_version": "1", "versions": {"1": pub}}})  # gone from the list: gone
    assert cat.get("garbage", None) is None and cat.left_out == {}
