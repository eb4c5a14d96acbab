"""``aieng quantize`` for real on the orientation demo model, in a temporary repository: INT8 and FP16
versions are written with a parity report and served by the real server with the same labels as the
source version; a version outside the tolerances is refused (nothing written) unless ``--force``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest

from aieng.tools.parity import render_page
from tests.conftest import MODELS, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    not os.path.isfile(os.path.join(MODELS, "orientation", "1", "model.onnx")),
    reason="demo models missing: run scripts/fetch_models.py")]


@pytest.fixture
def repo(tmp_path):
    """``<tmp>/models/orientation/1``: model.yaml copied, model.onnx hard-linked (read-only here)."""
    src, dst = os.path.join(MODELS, "orientation", "1"), tmp_path / "models" / "orientation" / "1"
    dst.mkdir(parents=True)
    shutil.copy(os.path.join(src, "model.yaml"), dst / "model.yaml")
    try:
        os.link(os.path.join(src, "model.onnx"), dst / "model.onnx")
    except OSError:  # another filesystem
        shutil.copy(os.path.join(src, "model.onnx"), dst / "model.onnx")
    return tmp_path / "models"


def quantize(repo, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    return subprocess.run([sys.executable, "-m", "aieng.cli", "quantize", "orientation", "1",
                           "--repo", str(repo), "--samples", "16", "--speed-runs", "5", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _pages() -> list[bytes]:
    page = render_page(900, 1200, seed=1234)  # not one of the parity or calibration pages
    rots = [None, cv2.ROTATE_90_CLOCKWISE, cv2.ROTATE_180, cv2.ROTATE_90_COUNTERCLOCKWISE]
    return [cv2.imencode(".jpg", page if r is None else cv2.rotate(page, r))[1].tobytes() for r in rots]


def test_int8_and_fp16_versions_are_written_and_served(repo, make_server):
    int8 = quantize(repo, "--to", "int8")
    assert int8.returncode == 0, int8.stdout + int8.stderr
    fp16 = quantize(repo, "--to", "fp16")
    assert fp16.returncode == 0, fp16.stdout + fp16.stderr
    assert sorted(os.listdir(repo / "orientation")) == ["1", "2", "3"]
    assert [p for p in os.listdir(repo) if p.startswith(".")] == []  # no temporary directory left

    for version, to in (("2", "int8"), ("3", "fp16")):
        report = json.loads((repo / "orientation" / version / "parity.json").read_text())
        out = report["outputs"]["fetch_name_0"]
        assert report["to"] == to and report["failures"] == [] and report["forced"] is False
        assert out["metric"] == "top1"
        assert out["top1"] >= report["tolerances"]["min_top1"]
        assert [r["batch"] for r in report["speed"]] == [1, 8]
        assert all(r["source_ms"] > 0 and r["new_ms"] > 0 for r in report["speed"])
    assert "speed batch  1" in int8.stdout and "wrote" in int8.stdout

    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                      AIENG_POSTPROCESS_WORKERS="1").start()
    with srv.client(timeout_s=30) as c:
        listed = c.models()["models"]["orientation"]
        assert listed["default_version"] == "3"
        assert "static int8 quantization of version 1" in listed["versions"]["2"]["description"]
        labels = {}
        for version in ("1", "2", "3"):
            replies = [c.infer("orientation", {"image": img}, version=version) for img in _pages()]
            assert [r["version"] for r in replies] == [version] * 4
            labels[version] = [r["outputs"]["label"] for r in replies]
            assert all(r["outputs"]["scores"].dtype == np.float32 for r in replies)  # I/O stays float32
    assert labels["1"] == ["0", "90", "180", "270"]  # the pages really were rotated
    assert labels["2"] == labels["1"]
    assert labels["3"] == labels["1"]
    assert srv.stop() == 0


def test_outside_tolerance_is_refused_unless_forced(repo):
    refused = quantize(repo, "--to", "int8", "--max-abs-diff", "0")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "FAILED fetch_name_0: max abs diff" in refused.stdout
    assert "refused" in refused.stderr
    assert os.listdir(repo / "orientation") == ["1"]
    assert [p for p in os.listdir(repo) if p.startswith(".")] == []

    forced = quantize(repo, "--to", "int8", "--max-abs-diff", "0", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    report = json.loads((repo / "orientation" / "2" / "parity.json").read_text())
    assert report["forced"] is True
    assert report["failures"][0].startswith("fetch_name_0: max abs diff")


def test_existing_or_escaping_out_version_is_an_error(repo):
    done = quantize(repo, "--to", "fp16", "--out-version", "1")
    assert done.returncode == 2
    assert "already exists" in done.stderr
    done = quantize(repo, "--to", "fp16", "--out-version", "../x")
    assert done.returncode == 2
    assert "letters, digits" in done.stderr
    assert os.listdir(repo / "orientation") == ["1"]
