"""A batch's outputs to the postprocess pool: the executor's ``Outputs`` against a real ONNX session and a
real ring, and a real ``PostprocessWorker`` reading what it sent.  The rows of the requests routed to one
worker go into one slot with one ``PostBatch`` where they are whole rows and fit; else each request gets its
own slot and ``PostTask``."""
from __future__ import annotations

import logging
import os
import time
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest

from aieng.config import Config
from aieng.gpu_executor.batcher import Pending
from aieng.gpu_executor.inline_post import InlinePost
from aieng.gpu_executor.outputs import Outputs
from aieng.gpu_executor.sessions import ModelSession
from aieng.postprocess_workers.worker import PostprocessWorker
from aieng.processing.pre.tabular import TabularPreprocessor
from aieng.runtime.worker import HubWorker
from aieng.wire import messages as m
from aieng.wire import shm
from tests.unit.demo import needs_demo_models
from tests.unit.demo import spec as demo_spec

pytestmark = needs_demo_models
log = logging.getLogger("test")
SLOT = 4096  # bytes (a page: a ring's least): 341 requests' outputs (3 float32 each) fit, no more
MANY = 400
ROWS = [{"bill_length_mm": 39.1 + i % 20, "bill_depth_mm": 18.7, "flipper_length_mm": 181 + i % 30,
         "body_mass_g": 3750 - 10 * (i % 40), "island": ["Torgersen", "Biscoe", "Dream"][i % 3],
         "sex": ["male", "female"][i % 2]} for i in range(MANY)]


class Sent:
    """The executor's sends: to each postprocess worker (``Outbound.send``) and to the frontend."""

    def __init__(self):
        self.to: dict[str, list] = {}
        self.frontend: list = []
        self.failed: list = []

    def send(self, dest: str, data: bytes, body=None) -> bool:
        self.to.setdefault(dest, []).append(m.decode(data))
        return True


@pytest.fixture(scope="module")
def session():
    return ModelSession(demo_spec("tabular"), "cpu", 1)


@pytest.fixture
def ring():
    r = shm.Ring.create(shm.segment_name("test", "executor", os.getpid()), MANY + 8, SLOT)
    yield r
    r.close()
    r.seg.unlink()


def run_batch(session, ring, posts: list[str], epochs: list[int] | None = None):
    """Run one batch of ``len(posts)`` tabular rows, request ``i`` routed to ``posts[i]`` in its epoch
    ``epochs[i]`` (0); what was sent."""
    pre = TabularPreprocessor(demo_spec("tabular"))
    per = [dict(pre.process(row)[0]) for row in ROWS[:len(posts)]]
    feeds, sizes = session.feeds_from(per)
    outputs = session.run(feeds)
    sent = Sent()
    deadline = time.monotonic() + 5
    live = [Pending(100 + i, 0, 0.0, deadline,
                    m.InferTask(100 + i, "tabular", "1", deadline, None, 0, 0, post, {"top_k": 1},
                                epoch=(epochs or [0] * len(posts))[i]))
            for i, post in enumerate(posts)]
    publish = HubWorker.publish.__get__(SimpleNamespace(heartbeat=lambda: None))
    outs = Outputs(Config(), ring, publish, InlinePost(0), sent.frontend.append,
                   lambda rid, code, message: sent.failed.append((rid, code, message)), sent, log)
    outs.deliver("tabular:1", session, outputs, sizes, live, time.monotonic(), 50, 0)
    return sent, outputs


def test_the_rows_for_one_worker_share_one_slot_and_message(session, ring):
    sent, outputs = run_batch(session, ring, ["post-0", "post-1", "post-0"])
    assert [type(x) for x in sent.to["post-0"]] == [m.PostBatch]
    assert [type(x) for x in sent.to["post-1"]] == [m.PostBatch]
    b0, b1 = sent.to["post-0"][0], sent.to["post-1"][0]
    assert [it.rid for it in b0.items] == [100, 102]
    assert [it.rid for it in b1.items] == [101]
    assert b0.items[1].params == {"top_k": 1}
    views = ring.views(b0.ref.slot, b0.ref.tensors)
    for name, out in zip(session.output_names, outputs):
        np.testing.assert_array_equal(views[name], out[[0, 2]])
    notice, = sent.frontend
    assert notice.rids == [100, 102, 101]  # by worker
    assert (notice.refs, notice.counts) == ([b0.ref.place(), b1.ref.place()], [2, 1])  # each slot once
    assert list(notice.each()) == [(100, b0.ref.place()), (102, b0.ref.place()), (101, b1.ref.place())]
    assert b0.ref.tensors != []  # the PostBatch's own ref describes the tensors
    assert sent.failed == []


def test_rows_of_two_epochs_of_one_worker_never_share_a_slot(session, ring):
    """A row routed before the worker's death and one routed after (``PreTask.epoch``): the first fails with
    the dead worker and the frontend frees its slot, which the second must not be reading."""
    sent, _ = run_batch(session, ring, ["post-0", "post-0", "post-0"], epochs=[0, 1, 0])
    batches = sent.to["post-0"]
    assert [[it.rid for it in b.items] for b in batches] == [[100, 102], [101]]
    assert batches[0].ref.slot != batches[1].ref.slot


def test_rows_too_big_for_one_slot_take_a_slot_each(session, ring):
    sent, outputs = run_batch(session, ring, ["post-0"] * MANY)
    bundle, = sent.to["post-0"]
    tasks = [m.decode(item) for item in bundle.items]
    assert [t.rid for t in tasks] == list(range(100, 100 + MANY))
    assert {type(t) for t in tasks} == {m.PostTask}
    assert len({t.ref.slot for t in tasks}) == MANY
    assert list(sent.frontend[0].each()) == [(t.rid, t.ref.place()) for t in tasks]
    assert sent.frontend[0].counts == [1] * MANY


def test_rows_that_are_not_whole_take_a_slot_each(session, ring, monkeypatch):
    monkeypatch.setattr(session, "whole_rows", False)  # as for a model whose outputs padding cuts back
    sent, _ = run_batch(session, ring, ["post-0", "post-0"])
    bundle, = sent.to["post-0"]
    assert [type(m.decode(item)) for item in bundle.items] == [m.PostTask, m.PostTask]


@pytest.fixture
def worker(tmp_path):
    specs = {"tabular:1": demo_spec("tabular")}
    w = PostprocessWorker(Config(runtime_dir=str(tmp_path)), specs, "post-0", log)
    w.sent = []
    w.send_data = lambda data: w.sent.append(m.decode(data))
    yield w
    w.close()


def answers(w: PostprocessWorker) -> list:
    w.flush()
    out = []
    for msg in w.sent:
        out += [m.decode(item) for item in msg.items] if type(msg) is m.Bundle else [msg]
    return out


def test_the_worker_answers_each_row_of_a_batch_as_its_own_task(session, ring, worker):
    sent, _ = run_batch(session, ring, ["post-0", "post-0", "post-0"])
    batch, = sent.to["post-0"]
    worker.handle_batch(batch, [])
    got = answers(worker)
    assert [r.rid for r in got] == [100, 101, 102]
    assert {type(r) for r in got} == {m.Result}
    assert not ring.holds(batch.ref.slot, batch.ref.gen)  # freed once every row is answered
    values = [msgpack.unpackb(r.outputs) for r in got]
    assert values == [msgpack.unpackb(r.outputs) for r in per_task_answers(session, ring, worker)]


def per_task_answers(session, ring, worker) -> list:
    """The same three rows through the per-request path (a slot and a ``PostTask`` each)."""
    worker.sent.clear()
    session.whole_rows = False
    try:
        sent, _ = run_batch(session, ring, ["post-0", "post-0", "post-0"])
    finally:
        session.whole_rows = True
    for item in sent.to["post-0"][0].items:
        worker.handle(m.decode(item), [])
    return answers(worker)


def test_a_batch_whose_slot_was_freed_is_skipped(session, ring, worker):
    sent, _ = run_batch(session, ring, ["post-0", "post-0"])
    batch, = sent.to["post-0"]
    assert ring.free(batch.ref.slot, batch.ref.gen)  # as the frontend does when the worker that held it died
    worker.handle_batch(batch, [])
    assert answers(worker) == []


def test_a_batch_of_a_version_not_loaded_here_fails_every_row(session, ring, worker):
    sent, _ = run_batch(session, ring, ["post-0", "post-0"])
    batch, = sent.to["post-0"]
    batch.version = "2"
    worker.handle_batch(batch, [])
    got = answers(worker)
    assert [(type(r), r.rid, r.code) for r in got] == [(m.Failed, 100, "UNAVAILABLE"),
                                                       (m.Failed, 101, "UNAVAILABLE")]
    assert not ring.holds(batch.ref.slot, batch.ref.gen)


def test_a_batch_whose_executor_went_away_fails_every_row(session, ring, worker):
    sent, _ = run_batch(session, ring, ["post-0", "post-0"])
    batch, = sent.to["post-0"]
    batch.ref.seg = shm.segment_name("test", "executor", 1)  # a segment nobody made: its executor is gone
    worker.handle_batch(batch, [])
    got = answers(worker)
    assert [(type(r), r.rid, r.code) for r in got] == [(m.Failed, 100, "UNAVAILABLE"),
                                                       (m.Failed, 101, "UNAVAILABLE")]
