"""Where a model's postprocessing runs (``gpu_executor/inline_post``): the rule, the measurement, the answer.

Real demo specs and real one-thread ONNX Runtime sessions; no processes.
"""
from __future__ import annotations

import logging
import time

import msgpack
import numpy as np

from aieng.gpu_executor.inline_post import EXECUTOR, InlinePost, eligible
from aieng.gpu_executor.sessions import ModelSession
from aieng.models.repo import load_spec
from aieng.processing.post.chain import Chain
from aieng.wire import messages as m
from aieng.wire.protocol import decode_tensor
from tests.unit.demo import MODELS, needs_demo_models, spec, spec_with

pytestmark = needs_demo_models


def session(s) -> ModelSession:
    sess = ModelSession(s, "cpu", 1, False)
    sess.warmup(max_rows=1)
    return sess


def test_a_chain_with_a_time_limit_or_a_helper_thread_stays_in_the_pool():
    textdet = load_spec("textdet", "1", str(MODELS / "textdet" / "1"))
    assert eligible(Chain(textdet)) == "step 'db_boxes' has a time limit"
    threaded = spec_with("tabular", "postprocess", isolate="thread")
    assert eligible(Chain(threaded)) == "step 'classify' runs on a helper thread"
    assert eligible(Chain(spec("tabular"))) == ""


def test_a_cheap_chain_is_advertised_once_adopted():
    s = spec("tabular")
    inline = InlinePost(limit_us=10_000)
    choice = inline.consider(s, session(s))
    assert choice.where == EXECUTOR
    assert 0 < choice.us <= 10_000
    assert inline.advertised() == []  # decided on the loader thread, not yet in force
    inline.adopt(s.key)
    assert inline.advertised() == [s.key]
    assert inline.serves(s.key)
    assert inline.choices[s.key].view()["where"] == "executor"


def test_a_chain_over_the_limit_is_served_but_not_advertised():
    s = spec("tabular")
    inline = InlinePost(limit_us=1)
    choice = inline.consider(s, session(s))
    inline.adopt(s.key)
    assert choice.where == "pool"
    assert choice.why == f"{choice.us} us > 1 us"
    assert inline.advertised() == []
    assert inline.serves(s.key)  # a task already routed to the executor is still answered


def test_a_limit_of_zero_turns_it_off():
    s = spec("tabular")
    inline = InlinePost(limit_us=0)
    assert inline.consider(s, session(s)).why == "AIENG_INLINE_POSTPROCESS_US is 0"
    inline.adopt(s.key)
    assert inline.advertised() == []


def test_drop_forgets_the_version():
    s = spec("tabular")
    inline = InlinePost(limit_us=10_000)
    inline.consider(s, session(s))
    inline.adopt(s.key)
    inline.drop(s.key)
    assert not inline.serves(s.key)
    assert inline.advertised() == []


def test_the_answer_is_what_the_pool_would_send():
    s = spec("tabular")
    sess = session(s)
    inline = InlinePost(limit_us=10_000)
    inline.consider(s, sess)
    inline.adopt(s.key)
    feeds = sess._feeds(1, 0)
    outs = sess.run(feeds)
    tensors = sess.request_outputs(outs, 0, {})
    trail = m.Trail()
    task = m.InferTask(rid=7, model="tabular", version="1", deadline=0.0, ref=None, seq_len=0, upstream=0,
                       post=EXECUTOR, params={}, trail=trail, features={"bill_length_mm": 41.0})
    before = time.monotonic()
    result = inline.answer(s.key, task, tensors, logging.getLogger("t"))
    assert isinstance(result, m.Result)
    assert (result.rid, result.features) == (7, {"bill_length_mm": 41.0})  # the drift facts ride along
    assert before <= result.trail.post_started <= time.monotonic()
    want = Chain(s).run(dict(tensors), {}, 0, None)
    got = msgpack.unpackb(result.outputs)
    assert got["label"] == want.values["label"]
    np.testing.assert_allclose(decode_tensor(got["probabilities"]), want.values["probabilities"])
    assert [(name, outcome) for name, _us, outcome in result.steps] == [("classify", "ok")]
