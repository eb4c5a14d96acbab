"""Issue 36: what a dead postprocess worker held at POST (or what was on its way to it) gets one second try
on its replacement, one at a time (frontend/requests/retries.py), against the fake peers of
``test_frontend``'s rig.

The rig runs one postprocess worker, ``post-0``; its deaths are the supervisor's ``WorkerDown`` and its new
incarnations a ``Hello`` with a new pid.  Each test checks what the client is answered, what the executor is
asked (``m.Repost``: the request, its output slot, the worker), that the output slot is kept for the second
try and freed when the request ends without one, and the table's accounting (holder, stage counts,
``by_post``).
"""
from __future__ import annotations

import pytest

from aieng.frontend.requests.table import POST
from aieng.wire import messages as m
from tests.component.test_frontend import TAB, Rig, dispatched, result
from tests.unit.demo import needs_demo_models

pytestmark = needs_demo_models
POST0 = 1006  # the rig's post-0 pid (1000 + len(name)); each new incarnation below adds 1000


@pytest.fixture
def frontend(tmp_path):
    made: list[Rig] = []

    def make(**cfg) -> Rig:
        made.append(Rig(tmp_path, **cfg))
        return made[-1]

    yield make
    for r in made:
        r.close()


def at_post(r: Rig, *ids: str, **extra) -> list[tuple[m.PreTask, m.Ref]]:
    """Requests ``ids`` sent, preprocessed and inferred: held by post-0, each with its output slot."""
    out = []
    for rid_of in ids:
        r.send({"id": rid_of, "model": "tabular", "inputs": TAB, **extra})
        task = dispatched(r, rid_of)
        r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [r.slot("pre-0")])))
        ref = r.slot("executor")
        r.peers["executor"].send(m.encode(m.Inferred([task.rid], [ref])))
        r.until(lambda: r.fe.table.get(task.rid).stage == POST)
        out.append((task, ref))
    return out


def down(r: Rig, pid: int, code: int) -> None:
    r.peers["supervisor"].send(m.encode(m.WorkerDown("post-0", code, pid)))
    r.until(lambda: r.fe.workers.died_at.get("post-0") is not None and "post-0" not in r.fe.workers.by_name)


def up(r: Rig, pid: int) -> None:
    r.peers["post-0"].send(m.encode(m.Hello("post-0", "postprocess", pid)))


def reposted(r: Rig) -> m.Repost:
    """The next thing the executor is asked is a ``Repost``, and nothing comes beside it."""
    msg, _ = r.expect("executor")
    assert isinstance(msg, m.Repost)
    assert not r.peers["executor"].poll(300), "a second Repost went to a worker holding a second try"
    return msg


def test_a_dead_workers_requests_are_posted_again_one_at_a_time_and_a_second_death_fails_only_its_own(
        frontend):
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    (a, ref_a), (b, ref_b) = at_post(r, "a", "b")
    t = r.fe.table
    assert (t.load("post-0"), t.by_post["post-0"]) == (2, 2)

    down(r, POST0, 1)
    r.until(lambda: all(t.get(x.rid).reposted for x in (a, b)))
    held = [t.get(x.rid) for x in (a, b)]
    assert [(q.stage, q.holder, q.reposted, q.fe_owns) for q in held] == [(POST, "", True, True)] * 2
    assert (t.load("post-0"), t.stage_totals[POST], t.by_post["post-0"]) == (0, 2, 2)
    assert r.busy(ref_a) and r.busy(ref_b)  # kept for the second tries
    assert not r.client.poll(200)  # nobody answered
    assert not r.peers["executor"].poll(200)  # nothing asked before the replacement is up

    up(r, POST0 + 1000)  # the replacement: "a" alone, then "b" once "a" left it
    first = reposted(r)
    assert (first.rid, first.ref, first.post) == (a.rid, ref_a, "post-0")
    assert (t.get(a.rid).holder, t.get(a.rid).fe_owns, r.fe.pipeline.retries.posting) == (
        "post-0", False, {"post-0": a.rid})
    r.peers["post-0"].send(m.encode(result(a.rid)))
    ok = r.answer()
    assert (ok["id"], ok["ok"]) == ("a", True)
    second = reposted(r)
    assert (second.rid, second.ref) == (b.rid, ref_b)

    down(r, POST0 + 1000, -11)  # "b" crashes it again: it fails, with this death's message
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"], reply["error"]["message"]) == (
        "b", "UNAVAILABLE", "post-0 exited (code -11) while holding the request")
    assert not r.busy(ref_b)  # freed: nobody else will
    assert (len(t), t.stage_totals[POST], t.by_post["post-0"]) == (0, 0, 0)
    assert not r.fe.pipeline.retries.active


def test_a_request_on_its_way_to_a_worker_that_died_gets_its_second_try_too(frontend):
    """Its ``Inferred`` came after the death: the task went to the dead worker's socket."""
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    task = dispatched(r)
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [r.slot("pre-0")])))
    down(r, POST0, -9)
    ref = r.slot("executor")
    r.peers["executor"].send(m.encode(m.Inferred([task.rid], [ref])))
    r.until(lambda: r.fe.table.get(task.rid).reposted)
    assert not r.client.poll(200) and r.busy(ref)
    up(r, POST0 + 1000)
    assert reposted(r).rid == task.rid
    r.peers["post-0"].send(m.encode(result(task.rid)))
    assert r.answer()["ok"] is True


def test_the_executor_finding_the_outputs_freed_leaves_the_answer_to_the_first_copy(frontend):
    """The replacement answered the task's first copy (it reached it after all) and freed the slot: the
    executor's ``POST_SLOT_GONE`` is skipped, the first copy's answer is the request's."""
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    [(a, ref)] = at_post(r, "a")
    down(r, POST0, -9)
    up(r, POST0 + 1000)
    assert reposted(r).rid == a.rid
    r.peers["executor"].send(m.encode(m.Failed(a.rid, "UNAVAILABLE", m.POST_SLOT_GONE, stage="postprocess")))
    r.until(lambda: not r.fe.pipeline.retries.posting)
    assert not r.client.poll(200) and r.fe.table.get(a.rid) is not None
    r.peers["post-0"].send(m.encode(result(a.rid)))
    reply = r.answer()
    assert (reply["id"], reply["ok"]) == ("a", True)


def test_a_second_try_waiting_past_its_deadline_is_answered_and_its_slot_freed(frontend):
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    [(a, ref)] = at_post(r, "a", timeout_ms=600)
    down(r, POST0, -9)  # no replacement comes
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"], reply["error"]["message"]) == (
        "a", "TIMEOUT", "no answer within the deadline (stage: waiting for a postprocess worker)")
    assert not r.busy(ref) and a.rid not in r.fe.table.ghosts
    up(r, POST0 + 1000)
    r.until(lambda: "post-0" in r.fe.workers.by_name)
    assert not r.peers["executor"].poll(300) and not r.fe.pipeline.retries.active
