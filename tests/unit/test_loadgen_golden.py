"""The bench's and ``aieng load``'s requests for a model that is neither a demo nor a tensor model (a hook
model: its own inputs): its latest version's golden set's inputs, in turn; without a golden set, one line
saying to add one.  The model's file entry loads with AIENG_ALLOW_MODEL_CODE, as in the server."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from aieng.tools import checks
from aieng.tools.loadgen import sample_inputs
from tests.conftest import MODELS, ROOT


def penguins(repo) -> str:
    d = repo / "penguins" / "1"
    shutil.copytree(os.path.join(ROOT, "examples", "penguins"), d)
    for f in ("model.onnx", "preprocess.json", "labels.json", "golden.json"):
        shutil.copy(os.path.join(MODELS, "tabular", "1", f), d / f)
    return str(d)


def test_golden_inputs_in_turn(tmp_path, monkeypatch):
    monkeypatch.setenv("AIENG_ALLOW_MODEL_CODE", "1")
    d = penguins(tmp_path)
    with open(os.path.join(d, "golden.json")) as fh:
        cases = [c["inputs"] for c in json.load(fh)["cases"]]
    rows = sample_inputs("penguins", len(cases) + 2, repo=str(tmp_path))
    assert rows == cases + cases[:2]


def test_no_golden_set_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("AIENG_ALLOW_MODEL_CODE", "1")
    os.unlink(os.path.join(penguins(tmp_path), "golden.json"))
    with pytest.raises(checks.UsageError, match="give its latest version a golden.json"):
        sample_inputs("penguins", 4, repo=str(tmp_path))


def test_the_file_entry_needs_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("AIENG_ALLOW_MODEL_CODE", raising=False)
    penguins(tmp_path)
    with pytest.raises(checks.UsageError, match="set AIENG_ALLOW_MODEL_CODE=1"):
        sample_inputs("penguins", 4, repo=str(tmp_path))
