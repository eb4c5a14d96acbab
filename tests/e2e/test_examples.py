"""The examples (issue 36), served as the README says: ``examples/penguins`` is a model whose pre- and
postprocessing are its own Python (model.py), on the tabular demo's ONNX file and saved state.  Its
repository is built by the code scripts/fetch_models.py runs (scripts/build_examples.py: the README's
``AIENG_ALLOW_MODEL_CODE=1 ./scripts/serve.sh --models-dir build/examples``), here into a tmp directory,
and served with the variable set; its answers equal the built-in ``tabular`` model's on the same inputs
(missing numbers and an unknown island included), natively and over OIP HTTP (tritonclient).  The same
repository without the variable does not start, and says why in one line.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th

from tests.conftest import MODELS, ROOT
from tests.e2e.test_python_pre import oip_infer, rows

pytestmark = pytest.mark.e2e
README_COMMAND = "AIENG_ALLOW_MODEL_CODE=1 ./scripts/serve.sh --models-dir build/examples"


def build_examples(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("build_examples", os.path.join(ROOT, "scripts",
                                                                                 "build_examples.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(Path(MODELS), out)
    return out


def answers(srv, model: str, sample: list[dict]) -> tuple[list[dict], tuple]:
    with srv.client() as c:
        native = [c.infer(model, r)["outputs"] for r in sample]
    http = th.InferenceServerClient(srv.oip_http)
    try:
        assert http.is_model_ready(model)
        return native, oip_infer(th, http, model, sample[:8])
    finally:
        http.close()


def test_the_penguins_example_answers_as_the_builtin_tabular_model(make_server, tmp_path):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        assert README_COMMAND in fh.read(), "the README's command is what this test serves"
    with open(os.path.join(ROOT, "scripts", "fetch_models.py"), encoding="utf-8") as fh:
        assert "build_examples" in fh.read(), "setup's fetch builds the examples' repository"
    repo = build_examples(tmp_path / "examples")
    assert sorted(os.listdir(repo)) == ["penguins"]
    sample = rows(24)

    builtin = make_server(AIENG_MODELS="tabular").start()
    want, want_oip = answers(builtin, "tabular", sample)
    assert builtin.stop() == 0

    refused = make_server()
    refused.args = ["--models-dir", str(repo)]  # serve.sh: ``exec aieng serve "$@"``
    refused.start(wait=False)
    assert refused.proc.wait(60) != 0
    assert "set AIENG_ALLOW_MODEL_CODE=1 to allow it" in refused.output()

    srv = make_server(AIENG_ALLOW_MODEL_CODE="1")
    srv.args = ["--models-dir", str(repo)]
    srv.start()
    got, got_oip = answers(srv, "penguins", sample)
    assert [g["label"] for g in got] == [w["label"] for w in want]
    np.testing.assert_allclose([g["probabilities"] for g in got], [w["probabilities"] for w in want],
                               atol=1e-6)
    assert list(got_oip[0]) == list(want_oip[0])
    np.testing.assert_allclose(got_oip[1], want_oip[1], atol=1e-6)
    with srv.client() as c:
        served = c.call({"op": "models"})["models"]["penguins"]["versions"]["1"]["onnx"]
    assert served["preprocess"]["where"] == "pool" and served["postprocess"]["where"] == "pool", served
