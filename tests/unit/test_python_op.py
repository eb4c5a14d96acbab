"""The ``python`` postprocess op (``processing/post/python_op``): a team's own class as the postprocess or as
one chain step, its error mapping and time limit, and the executor refusing it (``inline_post``).

Real specs (a copy of the tabular demo's version directory with user code beside it); no processes.
"""
from __future__ import annotations

import logging
import shutil
import sys
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest

from aieng.gpu_executor.inline_post import USER_CODE, InlinePost, eligible
from aieng.gpu_executor.inline_pre import InlinePre
from aieng.models import postprocess, repo
from aieng.processing import usercode
from aieng.processing.post.answer import answer
from aieng.processing.post.chain import Chain, StepTimedOut
from aieng.processing.post.python_op import DEFAULT_LIMIT_MS, RequestInputs, plain
from aieng.wire import messages as m
from aieng.wire.protocol import INTERNAL, INVALID_INPUT, RequestError, encode_tensor
from tests.unit.demo import MODELS, needs_demo_models

pytestmark = needs_demo_models

CODE = '''
import json, os, time
import numpy as np

BUILT = []


class Post:
    def __init__(self, spec):
        BUILT.append(spec)
        with open(os.path.join(spec.dir, "labels.json")) as fh:
            self.labels = json.load(fh)

    def post(self, outputs, inputs, params):
        if params.get("bad"):
            raise ValueError("bad input: " + params["bad"])
        if params.get("boom"):
            raise KeyError("boom")
        if params.get("spin"):
            while True:
                pass
        if params.get("nothing"):
            return None
        scores = outputs["probabilities"].reshape(-1).astype(np.float32)
        return {"label": self.labels[int(np.argmax(scores))], "probabilities": scores,
                "seen": sorted(outputs), "instances": len(BUILT), "inputs": inputs}


class Step:
    def __init__(self, spec):
        self.spec = spec

    def post(self, state, inputs):
        return {"best": int(np.argmax(state["p"])), "keys": sorted(state), "scale": self.spec.params["scale"],
                "top": [np.float32(x) for x in state["p"][:2]]}


class Echo:
    def __init__(self, spec):
        pass

    def post(self, outputs, inputs):
        island = inputs["island"]
        return {"island": island, "mass": inputs["body_mass_g"], "kind": type(island).__name__}
'''

SCORES = np.array([0.1, 0.7, 0.2], np.float32)


def version_dir(tmp_path, post_yaml: str, timeout: str | None = "timeout_ms: 5000"):
    d = tmp_path / "tabular_py" / "1"
    shutil.copytree(MODELS / "tabular" / "1", d)
    text = (d / "model.yaml").read_text()
    text = text[:text.index("postprocess:")] + post_yaml + text[text.index("batching:"):]
    if timeout is None:
        text = text.replace("timeout_ms: 5000\n", "")
    (d / "model.yaml").write_text(text)
    (d / "post.py").write_text(CODE)
    return d


def load(d, allow: bool = True):
    return repo.load_spec("tabular_py", "1", str(d), allow_code=allow)


def outs() -> dict:
    view = SCORES.copy()
    view.flags.writeable = False  # as the executor's ring gives them
    return {"probabilities": view}


def test_the_single_op_form_builds_post_once_with_its_hook_spec_and_answers(tmp_path):
    d = version_dir(tmp_path, 'postprocess: {type: python, entry: "post.py:Post", mine: {a: 1}}\n')
    spec = load(d)
    chain = Chain(spec)
    module = sys.modules[usercode.package_name(spec) + ".post"]
    hook = module.BUILT[0]
    assert (hook.name, hook.version, hook.dir, hook.params) == ("tabular_py", "1", str(d), {"mine": {"a": 1}})
    assert [o[0] for o in hook.outputs] == ["label", "probabilities"]
    for _ in range(3):
        values = chain(outs(), {})
    assert values["label"] == "Chinstrap" and values["seen"] == ["probabilities"]
    assert values["instances"] == 1  # built once, used per request
    np.testing.assert_array_equal(values["probabilities"], SCORES)


def test_post_gets_the_requests_inputs_decoded_from_its_frame_and_params_only_when_it_asks(tmp_path):
    chain = Chain(load(version_dir(tmp_path, 'postprocess: {type: python, entry: "post.py:Echo"}\n')))
    frame = msgpack.packb({"inputs": {"island": "Dream", "body_mass_g": 4100}, "params": {"x": 1}})
    values = chain.run(outs(), {"x": 1}, 0, None, frame).values
    assert values == {"island": "Dream", "mass": 4100.0, "kind": "str"}
    assert chain.steps[0][1].with_params is False
    post = Chain(load(version_dir(tmp_path / "a", 'postprocess: {type: python, entry: "post.py:Post"}\n')))
    assert post.steps[0][1].with_params is True and post(outs(), {})["inputs"] == {}  # no frame: none


def test_the_inputs_are_read_from_the_frame_only_when_post_reads_them(tmp_path):
    spec = load(version_dir(tmp_path, 'postprocess: {type: python, entry: "post.py:Echo"}\n'))
    frame = msgpack.packb({"inputs": {"island": "Dream", "body_mass_g": 4100}})
    inputs = RequestInputs(spec, frame)
    assert inputs._inputs is None  # built per request, read by nobody yet: nothing decoded
    assert inputs["island"] == "Dream"
    assert inputs.get("sex") is None
    assert "body_mass_g" in inputs
    assert dict(inputs) == {"island": "Dream", "body_mass_g": 4100}
    assert len(inputs) == 2
    with pytest.raises(KeyError):
        inputs["sex"]


def test_a_declared_tensor_input_reaches_post_as_its_array_as_it_reaches_pre():
    decl = SimpleNamespace(name="x", kind="tensor", optional=False)
    spec = SimpleNamespace(name="m", inputs=[decl], inputs_by_name={"x": decl})
    sent = np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = RequestInputs(spec, msgpack.packb({"inputs": {"x": encode_tensor(sent)}}))
    np.testing.assert_array_equal(inputs["x"], sent)
    assert inputs["x"].dtype == np.float32


def test_a_python_step_sees_the_state_so_far_and_its_values_join_the_answer(tmp_path):
    d = version_dir(tmp_path, "postprocess:\n  steps:\n"
                              "    - {op: softmax, source: probabilities, output: p}\n"
                              '    - {op: python, name: mine, entry: "post.py:Step", scale: 2}\n')
    values = Chain(load(d))(outs(), {})
    assert list(values) == ["p", "best", "keys", "scale", "top"]
    assert values["best"] == 1 and values["keys"] == ["p", "probabilities"] and values["scale"] == 2
    assert all(type(x) is float for x in values["top"])  # numpy scalars inside a list made plain for msgpack


def test_errors_are_the_requests_value_error_invalid_input_others_internal_with_a_logged_traceback(
        tmp_path, caplog):
    chain = Chain(load(version_dir(tmp_path, 'postprocess: {type: python, entry: "post.py:Post"}\n')))
    with pytest.raises(RequestError) as bad:
        chain(outs(), {"bad": "x"})
    assert (bad.value.code, bad.value.message) == (INVALID_INPUT, "bad input: x")
    task = m.PostTask(7, "tabular_py", "1", None, {"boom": True}, trace="t-123")
    log = logging.getLogger("test.python_op")
    with caplog.at_level(logging.ERROR, "test.python_op"):
        failed = answer(chain, task, outs(), log)
    assert isinstance(failed, m.Failed) and (failed.code, failed.message) == (INTERNAL, "KeyError: 'boom'")
    rec = [r for r in caplog.records if 'raise KeyError("boom")' in r.getMessage()]
    assert rec and rec[0].trace == "t-123" and "7" in rec[0].getMessage()
    task.params = {"nothing": True}
    failed = answer(chain, task, outs(), log)
    assert failed.code == INTERNAL and failed.message.startswith("TypeError: post() must return a dict")
    task.params = {}
    ok = answer(chain, task, outs(), log)
    assert isinstance(ok, m.Result) and msgpack.unpackb(ok.outputs)["label"] == "Chinstrap"


@pytest.mark.parametrize("isolate", ["inline", "thread"])
def test_user_code_is_always_timed_and_a_stopped_call_leaves_its_instance(tmp_path, isolate):
    d = version_dir(tmp_path, 'postprocess: {type: python, entry: "post.py:Post", timeout_ms: 400, '
                              f'isolate: {isolate}}}\n')
    chain = Chain(load(d))
    assert chain(outs(), {})["instances"] == 1
    with pytest.raises(StepTimedOut, match="ran past its 400 ms limit"):
        chain(outs(), {"spin": True})
    assert chain(outs(), {})["instances"] == 2  # a new Post(spec): the stopped call's is never reused
    assert chain(outs(), {})["instances"] == 2
    # no timeout_ms on the step: the model's, else DEFAULT_LIMIT_MS
    plain_yaml = 'postprocess: {type: python, entry: "post.py:Post"}\n'
    assert Chain(load(version_dir(tmp_path / "a", plain_yaml))).steps[0][0]["timeout_ms"] == 5000
    no_model = Chain(load(version_dir(tmp_path / "b", plain_yaml, timeout=None)))
    assert no_model.steps[0][0]["timeout_ms"] == DEFAULT_LIMIT_MS


def test_the_executor_refuses_user_code_without_building_the_chain(tmp_path):
    spec = load(version_dir(tmp_path, 'postprocess: {type: python, entry: "post.py:Post"}\n'))
    inline = InlinePost(limit_us=10_000)
    assert inline.consider(spec, None).view() == {"where": "pool", "us": 0, "why": USER_CODE}
    assert usercode.package_name(spec) + ".post" not in sys.modules  # never imported to decide
    assert inline.adopt(spec.key) is not None and not inline.serves(spec.key)
    assert eligible(Chain(spec)) == USER_CODE
    # nor preprocesses it (its post needs the request frame, which only the pool path carries)
    pre = InlinePre(1 << 20, 1 << 20, 1_000_000)
    assert pre.consider(spec) == USER_CODE
    pre.adopt(spec.key)
    assert spec.key not in pre.procs


def test_the_scan_checks_a_python_steps_entry_and_the_operators_consent(tmp_path):
    d = version_dir(tmp_path, 'postprocess: {steps: [{op: python, entry: "post.py:Post"}]}\n')
    with pytest.raises(repo.ModelError, match="AIENG_ALLOW_MODEL_CODE=1") as exc:
        load(d, allow=False)
    assert "\n" not in str(exc.value) and "postprocess step 1 'python'" in str(exc.value)
    d2 = version_dir(tmp_path / "a", 'postprocess: {type: python, entry: "nope.py:Post"}\n')
    with pytest.raises(repo.ModelError, match="nope.py is not a file"):
        load(d2)
    d3 = version_dir(tmp_path / "b", 'postprocess: {type: python, entry: "json:JSONDecoder"}\n')
    assert load(d3, allow=False).postprocess.steps[0].op == "python"  # a module: the operator's own
    with pytest.raises(ValueError, match="missing required parameter 'entry'"):
        postprocess.parse({"type": "python"})


def test_a_skipped_python_step_skips_the_steps_that_read_what_it_declares_it_writes(tmp_path):
    d = version_dir(tmp_path, "postprocess:\n  steps:\n"
                              '    - {op: python, entry: "post.py:Post", timeout_ms: 50, on_timeout: skip,'
                              ' writes: [probabilities2]}\n'
                              "    - {op: softmax, name: s1, source: probabilities2, output: p}\n"
                              "    - {op: softmax, name: s2, source: probabilities, output: q}\n")
    out = Chain(load(d)).run(outs(), {"spin": True})
    assert out.skipped == ["python", "s1"] and list(out.values) == ["q"]


def test_plain_values():
    assert plain([np.float32(0.5), np.int64(2), {"a": np.arange(2)}, (np.bool_(True),)]) == \
        [0.5, 2, {"a": [0, 1]}, [True]]
