"""The tools' in-process pipeline (``tools/inprocess.py``: the bench's limit, the baseline, ``aieng models
try``) runs a hook model's own Pre and Post through the pool's loader, and a ``python`` postprocess gets
each request's own inputs, as in the server; its answers equal the built-in tabular model's."""
from __future__ import annotations

import os

import numpy as np

from aieng.tools.inprocess import InProcessModel, load_spec
from tests.conftest import MODELS
from tests.unit.test_loadgen_golden import penguins

ECHO = '''

class Echo(Post):
    def post(self, outputs, inputs):
        return {**super().post(outputs, inputs), "island": inputs.get("island", "-")}
'''


def test_hooks_in_process_with_the_request_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("AIENG_ALLOW_MODEL_CODE", "1")
    d = penguins(tmp_path)
    with open(os.path.join(d, "model.py"), "a") as fh:
        fh.write(ECHO)
    with open(os.path.join(d, "model.yaml")) as fh:
        text = fh.read().replace('"model.py:Post"', '"model.py:Echo"')
    with open(os.path.join(d, "model.yaml"), "w") as fh:
        fh.write(text)
    hook = InProcessModel(load_spec("penguins", str(tmp_path)))
    builtin = InProcessModel(load_spec("tabular", MODELS))
    rows = [{"island": "Biscoe", "bill_length_mm": 45.1}, {"island": "Dream", "body_mass_g": 3000.0}, {}]
    got = hook.answer(hook.session(1, False), hook.encode([dict(r) for r in rows]), inputs=rows)
    want = builtin.answer(builtin.session(1, False), builtin.encode([dict(r) for r in rows]))
    assert [g["island"] for g in got] == ["Biscoe", "Dream", "-"]
    assert [g["label"] for g in got] == [w["label"] for w in want]
    np.testing.assert_allclose([g["probabilities"] for g in got], [w["probabilities"] for w in want],
                               atol=1e-6)
