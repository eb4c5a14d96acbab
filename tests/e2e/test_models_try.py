"""``aieng models try PATH --input NAME=VALUE``: one input through a version's pre, ONNX session and post in
the command's own process, no server, the answer printed as JSON (issue 36's in-process helper).  Run as a
user runs it (a subprocess of the CLI): on a hook model (the penguins example built into a tmp repository:
model.py's ``Pre`` and ``Post``) its answer equals the built-in ``tabular`` model's, as ``try`` prints it
and as a served ``tabular`` answers; on the demo ``minilm`` (built-in text processing) the embedding.  A
caller's mistake is one line and exit code 2 (the variable unset, naming it; a missing input; a path that
is no model; an input the hook refuses with ValueError); a bug in the hook prints its traceback and the
server's INTERNAL line, exit code 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import MODELS, ROOT
from tests.e2e.test_examples import build_examples

pytestmark = pytest.mark.e2e
ROW = {"bill_length_mm": 50.1, "flipper_length_mm": 222.0, "island": "Biscoe", "sex": "female"}


def aieng_try(path, *args: str, allow: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    if allow:
        env["AIENG_ALLOW_MODEL_CODE"] = "1"
    return subprocess.run([sys.executable, "-m", "aieng.cli", "models", "try", str(path), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def inputs(row: dict) -> list[str]:
    return [a for k, v in row.items()
            for a in ("--input", f"{k}={v if isinstance(v, str) else json.dumps(v)}")]


@pytest.fixture(scope="module")
def penguins(tmp_path_factory):
    return build_examples(tmp_path_factory.mktemp("try") / "examples") / "penguins" / "1"


def test_a_hook_model_answers_as_the_builtin_and_as_the_server(penguins, make_server):
    hook = aieng_try(penguins, *inputs(ROW))
    builtin = aieng_try(os.path.join(MODELS, "tabular", "1"), *inputs(ROW))
    assert hook.returncode == 0 and builtin.returncode == 0, (hook.stderr, builtin.stderr)
    got, want = json.loads(hook.stdout), json.loads(builtin.stdout)
    assert (got["model"], got["version"], want["model"]) == ("penguins", "1", "tabular")
    assert got["outputs"]["label"] == want["outputs"]["label"]
    np.testing.assert_allclose(got["outputs"]["probabilities"], want["outputs"]["probabilities"], atol=1e-6)
    with make_server(AIENG_MODELS="tabular").start().client() as c:
        served = c.infer("tabular", ROW)["outputs"]
    assert served["label"] == got["outputs"]["label"]
    np.testing.assert_allclose(served["probabilities"], got["outputs"]["probabilities"], atol=1e-6)
    # a model directory: its latest served version
    assert json.loads(aieng_try(penguins.parent, *inputs(ROW)).stdout) == got


def test_a_builtin_text_model():
    done = aieng_try(os.path.join(MODELS, "minilm", "1"), "--input", "text=A man is eating food.",
                     allow=False)
    assert done.returncode == 0, done.stderr
    emb = np.array(json.loads(done.stdout)["outputs"]["embedding"])
    assert emb.shape == (384,) and abs(np.linalg.norm(emb) - 1.0) < 1e-3


def test_mistakes_are_one_line_and_exit_2(penguins, tmp_path):
    cases = {
        "unset": (aieng_try(penguins, *inputs(ROW), allow=False),
                  "entry 'model.py:Pre' runs Python from the model directory: set AIENG_ALLOW_MODEL_CODE=1 "
                  "to allow it"),
        "missing": (aieng_try(os.path.join(MODELS, "minilm", "1")),
                    "aieng: INVALID_INPUT: missing input 'text'"),
        "nowhere": (aieng_try(tmp_path / "nope"), "not a directory"),
        "no input": (aieng_try(penguins, "--input", "island"),
                     "aieng: --input takes NAME=VALUE, got 'island'"),
    }
    for name, (done, says) in cases.items():
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (name, done.stderr)
        assert done.stdout == "", name


def test_the_hook_s_errors(penguins, tmp_path):
    bad = tmp_path / "bad" / "penguins" / "1"
    bad.mkdir(parents=True)
    for f in os.listdir(penguins):
        (bad / f).write_bytes((penguins / f).read_bytes())
    code = (bad / "model.py").read_text().replace(
        '        vec = np.zeros(self.width, dtype=np.float32)\n',
        '        if inputs.get("island") == "Atlantis":\n'
        '            raise ValueError("no penguins on Atlantis")\n'
        '        if inputs.get("sex") == "unknown":\n'
        '            return {}["features"]\n'
        '        vec = np.zeros(self.width, dtype=np.float32)\n')
    assert "Atlantis" in code
    (bad / "model.py").write_text(code)
    refused = aieng_try(bad, "--input", "island=Atlantis")
    assert refused.returncode == 2
    assert refused.stderr.strip() == "aieng: INVALID_INPUT: no penguins on Atlantis"
    bug = aieng_try(bad, "--input", "sex=unknown")
    assert bug.returncode == 1 and bug.stdout == ""
    assert "Traceback" in bug.stderr and 'return {}["features"]' in bug.stderr
    assert bug.stderr.strip().splitlines()[-1] == "aieng: INTERNAL: KeyError: 'features'"
    fine = aieng_try(bad, *inputs(ROW))
    assert fine.returncode == 0 and json.loads(fine.stdout)["model"] == "penguins"


def test_a_bare_onnx_file_takes_json_tensors(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    d = tmp_path / "double" / "1"
    d.mkdir(parents=True)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "double", io[:1], io[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(d / "model.onnx"))
    done = aieng_try(d, "--input", "x=[1, 2.5, -3]", allow=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"] == {"y": [2.0, 5.0, -6.0]}
    wrong = aieng_try(d, "--input", "x=[1, 2]", allow=False)
    assert (wrong.returncode, wrong.stderr.strip()) == (
        2, "aieng: INVALID_INPUT: input 'x' must have shape [3], got [2]")
