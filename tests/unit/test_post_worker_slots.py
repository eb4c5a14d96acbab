"""postprocess_workers/worker.py (issue 36): a slot is freed a drain after its answer left, so a worker that
dies leaves the slot of every answer it may not have sent; a second try (``PostTask.alone``) runs after the
rest of its drain was answered and sent, on its own.  A real worker on a real ring and hub socket; the chain
is a recorder (what runs a chain is ``processing/post``'s, tested there)."""
from __future__ import annotations

import logging
import os

import msgpack
import pytest
import zmq

from aieng.config import Config
from aieng.postprocess_workers import worker as post_worker
from aieng.wire import messages as m
from aieng.wire import shm
from aieng.wire.addresses import hub_addr
from tests.unit.demo import needs_demo_models
from tests.unit.demo import spec as demo_spec

pytestmark = needs_demo_models


@pytest.fixture
def rig(tmp_path, monkeypatch):
    hub = zmq.Context.instance().socket(zmq.ROUTER)
    hub.setsockopt(zmq.LINGER, 0)
    hub.bind(hub_addr(str(tmp_path)))
    ring = shm.Ring.create(shm.segment_name(f"7{os.getpid()}", "executor", os.getpid()), 8, 4096)
    ran: list[int] = []

    def answer(chain, task, views, log):  # the recorder: which task ran, in which order
        ran.append(task.rid)
        return m.Result(task.rid, msgpack.packb({"rid": task.rid}))

    monkeypatch.setattr(post_worker, "answer", answer)
    w = post_worker.PostprocessWorker(Config(runtime_dir=str(tmp_path)), {"tabular:1": demo_spec("tabular")},
                                      "post-0", logging.getLogger("test.post"))
    yield w, ring, hub, ran
    w.close()
    hub.close(0)
    ring.close()
    ring.seg.unlink()


def task(ring: shm.Ring, rid: int, alone: bool = False) -> m.PostTask:
    slot, gen = ring.alloc()
    return m.PostTask(rid, "tabular", "1", m.Ref(ring.seg.name, slot, gen, []), {}, alone=alone)


def sent(hub: zmq.Socket) -> list[list[int]]:
    """The answers' rids, per message the worker sent (a ``Bundle`` is one message)."""
    out = []
    while hub.poll(500):
        ident, data = hub.recv_multipart()
        msg = m.decode(data)
        items = [m.decode(i) for i in msg.items] if isinstance(msg, m.Bundle) else [msg]
        out.append([i.rid for i in items])
    return out


def test_a_second_try_runs_after_the_rest_of_its_drain_was_sent_and_alone(rig):
    w, ring, hub, ran = rig
    tasks = [task(ring, 1), task(ring, 2, alone=True), task(ring, 3)]
    for t in tasks:
        w.handle(t, [])
    assert ran == [1, 3]  # the second try waits for the rest of the drain
    w.after_drain(0.0)
    assert ran == [1, 3, 2]
    assert sent(hub) == [[1, 3], [2]]  # the others' answers left before it ran, its own on its own


def test_a_slot_is_freed_a_drain_after_its_answer_left(rig):
    w, ring, hub, ran = rig
    first = [task(ring, 1), task(ring, 2)]
    for t in first:
        w.handle(t, [])
    assert w.after_drain(0.0) == post_worker.RELEASE_MS  # answered and sent: held one drain more
    assert [ring.holds(t.ref.slot, t.ref.gen) for t in first] == [True, True]
    later = task(ring, 3)
    w.handle(later, [])
    assert w.after_drain(0.0) == post_worker.RELEASE_MS
    assert [ring.holds(t.ref.slot, t.ref.gen) for t in first + [later]] == [False, False, True]
    assert w.after_drain(0.0) is None  # an idle wake-up frees the last ones; then nothing is pending
    assert not ring.holds(later.ref.slot, later.ref.gen)
    assert sent(hub) == [[1, 2], [3]]
