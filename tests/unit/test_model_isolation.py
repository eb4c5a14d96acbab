"""Per-model isolation without processes: a model that fails to build in the executor, a
preprocess or a postprocess worker is recorded with its error and answered UNAVAILABLE; the
other models are built; a strict build fails naming the model and its path; a version whose
files changed since they were hashed is refused (aieng/models/repo.py build_each, verify_content)."""
from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from types import SimpleNamespace

import msgpack
import pytest

from aieng.config import Config
from aieng.gpu_executor.executor import Executor
from aieng.models.repo import ModelLoadError, build_each, failure_message, load_spec, verify_content
from aieng.postprocess_workers.worker import PostprocessWorker
from aieng.preprocess_workers.worker import PreprocessWorker
from aieng.wire import messages as m
from aieng.wire.protocol import UNAVAILABLE, RequestError
from tests.unit.demo import MODELS, needs_demo_models

pytestmark = needs_demo_models
log = logging.getLogger("test")
GARBAGE = b"\x08\x07not an onnx model\xff" * 64


def copy_model(src: str, dst, broken_file: str | None = None) -> None:
    """Copy a demo version dir (following the worktree's symlinks); optionally overwrite one file."""
    shutil.copytree(MODELS / src / "1", dst / src / "1", symlinks=False)
    if broken_file:
        (dst / src / "1" / broken_file).write_bytes(GARBAGE)


def specs_of(repo, *names) -> dict:
    return {f"{n}:1": load_spec(n, "1", str(repo / n / "1")) for n in names}


def test_build_each_records_a_failure_and_builds_the_rest(tmp_path):
    copy_model("tabular", tmp_path)
    spec = load_spec("tabular", "1", str(tmp_path / "tabular" / "1"))
    other = dataclasses.replace(load_spec("tabular", "1", str(tmp_path / "tabular" / "1")), name="other")

    def build(s):
        if s.name == "other":
            raise ValueError("bad\nthing")
        return s.name

    built, failed = build_each({spec.key: spec, other.key: other}, build, log, strict=False)
    assert built == {"tabular:1": "tabular"}
    assert failed == {"other:1": f"model other:1 ({other.path}): ValueError: bad thing"}
    with pytest.raises(ModelLoadError, match=r"model other:1 \(.*\): ValueError: bad thing"):
        build_each({spec.key: spec, other.key: other}, build, log, strict=True)


def test_verify_content_refuses_a_changed_file(tmp_path):
    copy_model("tabular", tmp_path)
    spec = load_spec("tabular", "1", str(tmp_path / "tabular" / "1"))
    verify_content(spec)
    (tmp_path / "tabular" / "1" / "labels.json").write_text('["x", "y", "z"]')
    with pytest.raises(ValueError) as err:
        verify_content(spec)
    msg = failure_message(spec, err.value, spec.onnx_path)
    assert msg.startswith(f"model tabular:1 ({spec.path}): ContentChanged: "
                          "content changed on disk since start "
                          f"(expected sha256 {spec.content_hash[:12]}..., found ")


def bare(cls, strict: bool):
    obj = cls.__new__(cls)  # only the per-model parts: no sockets, no rings
    obj.cfg = Config(device="cpu", intra_op_threads=1, strict_model_load=strict)
    obj.log = log
    return obj


def test_executor_serves_the_models_that_load(tmp_path):
    copy_model("tabular", tmp_path)
    shutil.copytree(tmp_path / "tabular", tmp_path / "broken")
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(GARBAGE)
    copy_model("orientation", tmp_path)
    specs = specs_of(tmp_path, "tabular", "broken", "orientation")
    (tmp_path / "orientation" / "1" / "model.onnx").write_bytes(GARBAGE)  # after the hash: a change on disk
    ex = bare(Executor, strict=False)
    ex.init_sessions(specs)
    assert list(ex.sessions) == ["tabular:1"]
    broken = specs["broken:1"]
    assert ex.failed["broken:1"].startswith(f"model broken:1 ({broken.onnx_path}): ")
    assert "content changed on disk since start" in ex.failed["orientation:1"]
    assert str(tmp_path / "orientation" / "1") in ex.failed["orientation:1"]

    calls = []
    ex.fail = lambda rid, code, message, ref=None: calls.append((rid, code, message))
    ex.accept(m.InferTask(7, "broken", "1", time.monotonic() + 5, m.Ref("seg", 0, 0, []), 0, 0, "post-0", {}))
    assert calls == [(7, UNAVAILABLE, ex.failed["broken:1"])]

    with pytest.raises(ModelLoadError, match=r"model broken:1 \(.*model\.onnx\): "):
        bare(Executor, strict=True).init_sessions(specs)


def test_preprocess_worker_answers_a_failed_model_unavailable(tmp_path):
    copy_model("tabular", tmp_path)
    copy_model("minilm", tmp_path, broken_file="tokenizer.json")
    specs = specs_of(tmp_path, "tabular", "minilm")
    w = bare(PreprocessWorker, strict=False)
    w.notice = m.Preprocessed([], [])
    w.init_processors(specs)
    assert list(w.procs) == ["tabular:1"]
    assert w.failed["minilm:1"].startswith(f"model minilm:1 ({specs['minilm:1'].path}): ")
    calls = []
    w.fail = lambda rid, code, message: calls.append((rid, code, message))
    body = SimpleNamespace(buffer=msgpack.packb({"inputs": {"text": "hello"}}))
    w.handle([(m.PreTask(3, "minilm", "1", time.monotonic() + 5), body)])
    assert calls == [(3, UNAVAILABLE, w.failed["minilm:1"])]
    with pytest.raises(ModelLoadError, match="model minilm:1"):
        bare(PreprocessWorker, strict=True).init_processors(specs)


def test_postprocess_worker_names_the_model_whose_labels_fail(tmp_path):
    """orientation reads its labels from the ONNX metadata: a corrupt file used to fail the worker
    with a bare 'ValueError: truncated field' that named no model."""
    copy_model("tabular", tmp_path)
    copy_model("orientation", tmp_path, broken_file="model.onnx")
    specs = specs_of(tmp_path, "tabular", "orientation")
    cfg = Config(strict_model_load=False, runtime_dir=str(tmp_path))  # its DEALER connects to nothing
    w = PostprocessWorker(cfg, specs, "post-0", log)
    try:
        assert list(w.ops) == ["tabular:1"]
        assert w.failed["orientation:1"].startswith(f"model orientation:1 ({specs['orientation:1'].path}): ")
        assert w.op("tabular:1") is w.ops["tabular:1"]
        with pytest.raises(RequestError) as err:
            w.op("orientation:1")
        assert err.value.code == UNAVAILABLE and err.value.message == w.failed["orientation:1"]
    finally:
        w.close()
    cfg = dataclasses.replace(cfg, strict_model_load=True)
    with pytest.raises(ModelLoadError, match="model orientation:1"):
        PostprocessWorker(cfg, specs, "post-0", log)
