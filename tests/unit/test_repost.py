"""gpu_executor/outputs.py's second tries (``Outputs.repost``, issue 36) on a real ring and a real inbox: the
task a batch sent to a postprocess worker is sent again, marked ``alone``, only while the ring holds its
slot at that generation; otherwise the frontend is told why (``POST_SLOT_GONE``, or the slot is not this
executor's)."""
from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest
import zmq

from aieng.config import Config
from aieng.gpu_executor.batcher import Pending
from aieng.gpu_executor.outputs import Outputs
from aieng.wire import messages as m
from aieng.wire import shm
from aieng.wire.addresses import post_addr


@pytest.fixture
def rig(tmp_path):
    cfg = Config(runtime_dir=str(tmp_path), postprocess_workers=1)
    ring = shm.Ring.create(shm.segment_name(f"8{os.getpid()}", "executor", os.getpid()), 4, 4096)
    inbox = zmq.Context.instance().socket(zmq.PULL)
    inbox.setsockopt(zmq.LINGER, 0)
    inbox.bind(post_addr(str(tmp_path), "post-0"))
    sent: list = []

    def publish(ring, tensors, deadline, code) -> m.Ref:
        slot, gen = ring.alloc()
        return m.Ref(ring.seg.name, slot, gen, [])

    out = Outputs(cfg, ring, publish, None, sent.append, None, logging.getLogger("test.outputs"))
    yield SimpleNamespace(out=out, ring=ring, inbox=inbox, sent=sent)
    out.close()
    inbox.close(0)
    ring.close()
    ring.seg.unlink()


def deliver(rig, *rids: int) -> list[m.PostTask]:
    """A batch of ``rids`` ran: its tasks reach post-0 (one message) and the frontend's notice names them."""
    live = [Pending(rid, 1, 0.0, 99.0,
                    m.InferTask(rid, "tabular", "1", 99.0, None, 0, 0, "post-0", {"n": rid})) for rid in rids]
    sess = SimpleNamespace(request_outputs=lambda outputs, row, size: {})
    rig.out.deliver("tabular:1", sess, None, [{}] * len(rids), live, 1.0, 10, 0)
    assert rig.inbox.poll(2000)
    msg = m.decode(rig.inbox.recv())
    tasks = [m.decode(i) for i in msg.items] if isinstance(msg, m.Bundle) else [msg]
    assert [t.rid for t in tasks] == list(rids) and not any(t.alone for t in tasks)
    assert rig.sent[-1] == m.Inferred(list(rids), [t.ref for t in tasks])
    return tasks


def test_a_held_slots_task_is_sent_again_alone_to_the_worker_named(rig):
    a, b = deliver(rig, 1, 2)
    rig.out.repost(m.Repost(b.rid, b.ref, "post-0"))
    assert rig.inbox.poll(2000)
    again = m.decode(rig.inbox.recv())
    assert isinstance(again, m.PostTask) and again.alone
    assert (again.rid, again.ref, again.params, again.trail) == (b.rid, b.ref, b.params, b.trail)
    assert len(rig.sent) == 1  # the batch's notice only: nothing more to the frontend


def test_a_freed_or_reused_slot_is_not_sent_again_and_the_frontend_is_told(rig):
    [a] = deliver(rig, 1)
    rig.ring.free(a.ref.slot, a.ref.gen)  # its worker answered and freed it
    rig.out.repost(m.Repost(a.rid, a.ref, "post-0"))
    assert rig.sent[-1] == m.Failed(a.rid, "UNAVAILABLE", m.POST_SLOT_GONE, stage="postprocess")
    for rid in range(2, 6):  # every slot used again: a's slot now holds another request, a newer generation
        deliver(rig, rid)
    assert rig.ring.holds(a.ref.slot, a.ref.gen + 1)
    rig.out.repost(m.Repost(a.rid, a.ref, "post-0"))
    assert rig.sent[-1] == m.Failed(a.rid, "UNAVAILABLE", m.POST_SLOT_GONE, stage="postprocess")
    assert not rig.inbox.poll(200)


def test_a_slot_of_another_executor_is_answered_as_gone_with_it(rig):
    [a] = deliver(rig, 1)
    old = m.Ref("aieng.1.executor.1", a.ref.slot, a.ref.gen, [])  # the dead predecessor's ring
    rig.out.repost(m.Repost(a.rid, old, "post-0"))
    assert rig.sent[-1] == m.Failed(a.rid, "UNAVAILABLE", "executor went away before postprocessing")
    assert not rig.inbox.poll(200)
