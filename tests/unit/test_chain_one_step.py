"""A chain of one step runs ``Chain.run_one``, without the bookkeeping of skipped steps; its outcome is the
general path's in every case: a hook's values, a built-in op's with its confidence, an ``answer`` list that
passes a model output through, a step skipped or failed at its limit.  Each chain is a real spec's (the
tabular demo's version directory with user code beside it, ``test_python_op``), run both ways."""
from __future__ import annotations

import numpy as np
import pytest

from aieng.processing.post.chain import Chain, StepTimedOut
from aieng.wire.records import Geometry
from tests.unit.demo import needs_demo_models
from tests.unit.test_python_op import load, outs, version_dir

pytestmark = needs_demo_models

CHAINS = {
    "hook": 'postprocess: {type: python, entry: "post.py:Post"}\n',
    "builtin op": "postprocess: {type: classify, source: probabilities, activation: softmax, "
                  "labels: {file: labels.json}, label_output: label, scores_output: scores}\n",
    "answer list": "postprocess:\n  steps: [{op: softmax, source: probabilities, output: p}]\n"
                   "  answer: [p, probabilities, nowhere]\n",
    "skipped": "postprocess:\n  steps:\n"
               '    - {op: python, entry: "post.py:Post", timeout_ms: 50, on_timeout: skip,\n'
               "       writes: [label]}\n"
               "  answer: [label, probabilities]\n",
}


def both(chain: Chain, params: dict, geometry=None) -> tuple:
    """The outcome by ``run`` (the one-step path) and by the general path, each as comparable values."""
    assert chain.one is not None
    fast = chain.run(outs(), params, 0, geometry, b"\x80")
    one, chain.one = chain.one, None
    try:
        slow = chain.run(outs(), params, 0, geometry, b"\x80")
    finally:
        chain.one = one
    return view(fast), view(slow)


def view(outcome) -> tuple:
    values = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in outcome.values.items()}
    values.pop("inputs", None)  # the hook's own echo of its RequestInputs object
    return (values, [(s.name, s.outcome) for s in outcome.steps], outcome.skipped, outcome.confidence,
            outcome.distance)


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_a_one_step_chain_answers_as_the_general_path(tmp_path, name):
    chain = Chain(load(version_dir(tmp_path, CHAINS[name])))
    fast, slow = both(chain, {"spin": True} if name == "skipped" else {})
    assert fast == slow
    assert fast[0] != {}  # a real answer on both paths, not two empty ones


def test_a_skipped_one_step_keeps_only_the_model_outputs_the_answer_names(tmp_path):
    chain = Chain(load(version_dir(tmp_path, CHAINS["skipped"])))
    fast, _ = both(chain, {"spin": True})
    assert fast[:3] == ({"probabilities": outs()["probabilities"].tolist()}, [("python", "skipped")],
                        ["python"])


def test_a_one_step_chain_past_its_fail_limit_times_out_with_its_step(tmp_path):
    chain = Chain(load(version_dir(tmp_path, 'postprocess: {type: python, entry: "post.py:Post", '
                                             'timeout_ms: 50}\n')))
    with pytest.raises(StepTimedOut) as exc:
        chain.run(outs(), {"spin": True})
    assert [(s.name, s.outcome) for s in exc.value.steps] == [("python", "timeout")]


def test_an_image_requests_geometry_takes_the_general_path(tmp_path, monkeypatch):
    chain = Chain(load(version_dir(tmp_path, CHAINS["hook"])))

    def not_here(*args):
        raise AssertionError("run_one took a request with an image's geometry")
    monkeypatch.setattr(chain, "run_one", not_here)
    fast, slow = both(chain, {}, Geometry(480, 640, 96, 128))
    assert fast == slow
    assert "geometry" not in fast[0]["seen"]  # the hook never sees the geometry the general path carries
    assert fast[0]["seen"] == ["probabilities"]


def test_a_skipped_one_step_drops_a_model_output_it_declares_it_writes(tmp_path):
    chain = Chain(load(version_dir(tmp_path, CHAINS["skipped"].replace("writes: [label]",
                                                                       "writes: [label, probabilities]"))))
    fast, slow = both(chain, {"spin": True})
    assert fast == slow
    assert fast[0] == {}  # its probabilities would have been the step's, which never came
