"""Issue 36: what a dead preprocess worker held at PRE gets one second try, alone on a worker
(frontend/requests/retries.py), against the fake peers of ``test_frontend``'s rig.

The rig's frontend runs one preprocess worker, ``pre-0``; its deaths are the supervisor's ``WorkerDown``
and its new incarnations a ``Hello`` with a new pid.  Each test checks what the client is answered, what is
sent to the worker (the client's own frame again, one second try at a time, nothing beside it) and the
table's accounting (holder, stage counts, ``busy``, the hold queue).
"""
from __future__ import annotations

import msgpack
import pytest

from aieng.frontend.requests.table import PRE
from aieng.wire import messages as m
from tests.component.test_frontend import TAB, Rig, dispatched, result
from tests.unit.demo import needs_demo_models

pytestmark = needs_demo_models
PRE0 = 1005  # the rig's pre-0 pid (1000 + len(name)); each new incarnation below adds 1000


@pytest.fixture
def frontend(tmp_path):
    made: list[Rig] = []

    def make(**cfg) -> Rig:
        made.append(Rig(tmp_path, **cfg))
        return made[-1]

    yield make
    for r in made:
        r.close()


def sent_alone(r: Rig, rid_of: str) -> m.PreTask:
    """The next task pre-0 gets is ``rid_of``'s, with its frame, and nothing comes beside it."""
    task = dispatched(r, rid_of)
    assert not r.peers["pre-0"].poll(300), "something was sent beside a second try"
    return task


def down(r: Rig, pid: int, code: int) -> None:
    r.peers["supervisor"].send(m.encode(m.WorkerDown("pre-0", code, pid)))
    r.until(lambda: r.fe.workers.died_at.get("pre-0") is not None and "pre-0" not in r.fe.workers.by_name)


def up(r: Rig, pid: int) -> None:
    r.peers["pre-0"].send(m.encode(m.Hello("pre-0", "preprocess", pid)))


def test_a_dead_workers_requests_are_sent_again_one_at_a_time_and_a_second_death_fails_only_its_own(frontend):
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    r.send({"id": "b", "model": "tabular", "inputs": TAB})
    a, b = dispatched(r, "a"), dispatched(r, "b")
    t = r.fe.table
    assert (t.busy("pre-0"), t.stage_totals[PRE]) == (2, 2)

    down(r, PRE0, 1)
    r.until(lambda: all(t.get(x.rid).retried for x in (a, b)))
    held = [t.get(x.rid) for x in (a, b)]
    assert [(q.stage, q.holder, q.retried) for q in held] == [(PRE, "", True)] * 2
    assert (t.busy("pre-0"), t.stage_totals[PRE], t.held_by("pre-0"), list(t.waiting[PRE])) == (
        0, 2, [], [a.rid, b.rid])
    assert not r.client.poll(200)  # nobody answered

    up(r, PRE0 + 1000)  # the restarted worker: "a" alone, then "b" alone once "a" left it
    assert sent_alone(r, "a").rid == a.rid
    r.send({"id": "c", "model": "tabular", "inputs": TAB})  # a new request waits behind the second tries
    r.until(lambda: len(t) == 3)
    assert not r.peers["pre-0"].poll(300)
    r.peers["pre-0"].send(m.encode(m.Preprocessed([a.rid], [r.slot("pre-0")])))
    assert sent_alone(r, "b").rid == b.rid  # "c" still waits: pre-0 holds a second try
    assert (t.get(b.rid).holder, t.busy("pre-0"), t.get(b.rid).body is not None) == ("pre-0", 1, True)

    down(r, PRE0 + 1000, -11)  # "b" crashes it again: it fails, with this death's message
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"], reply["error"]["message"]) == (
        "b", "UNAVAILABLE", "pre-0 exited (code -11) while holding the request")
    r.peers["executor"].send(m.encode(m.Inferred([a.rid], [r.slot("executor")], [1])))
    r.until(lambda: t.get(a.rid).stage == "postprocess")
    assert t.get(a.rid).body is None  # dropped once it left PRE
    r.peers["post-0"].send(m.encode(result(a.rid)))
    ok = r.answer()
    assert (ok["id"], ok["ok"]) == ("a", True)

    up(r, PRE0 + 2000)  # "c" was never held by a dead worker: it goes on as any request
    c = dispatched(r, "c")
    assert not t.get(c.rid).retried and t.stage_totals[PRE] == 1 and not r.fe.pipeline.retries.active


def test_a_request_answered_before_its_worker_died_is_not_sent_again(frontend):
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB, "timeout_ms": 300})  # the hung one
    task = dispatched(r)
    assert r.answer()["error"]["code"] == "TIMEOUT"
    assert r.fe.table.busy("pre-0") == 1  # its ghost: pre-0 still runs it
    down(r, PRE0, -9)
    up(r, PRE0 + 1000)
    r.until(lambda: "pre-0" in r.fe.workers.by_name)
    assert not r.peers["pre-0"].poll(300)
    assert (len(r.fe.table), r.fe.table.busy("pre-0"), task.rid in r.fe.table.ghosts) == (0, 0, False)
    assert not r.client.poll(200)


def test_a_stuck_workers_requests_get_a_second_try_and_fail_naming_the_budget_on_the_second(frontend):
    r = frontend(preprocess_budget_ms=1500)
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    dispatched(r)
    r.until(lambda: "pre-0" in r.fe.pipeline.stuck, 5)  # silent past the budget while holding it
    down(r, PRE0, -9)  # the supervisor replaced it
    up(r, PRE0 + 1000)
    sent_alone(r, "a")
    r.until(lambda: "pre-0" in r.fe.pipeline.stuck, 5)
    down(r, PRE0 + 1000, -9)
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"], reply["error"]["message"]) == (
        "a", "UNAVAILABLE",
        "pre-0 was replaced: it worked on one request for over AIENG_PREPROCESS_BUDGET_MS (1500 ms)")
    assert len(r.fe.table) == 0 and not r.fe.pipeline.retries.active


def test_the_executor_failing_the_dead_workers_copy_leaves_the_second_try_alone(frontend):
    """The dead worker forwarded it, and the executor found its segment gone: that copy's failure is not
    the request's; a later one (of the second try's copy) is."""
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    task = dispatched(r)
    down(r, PRE0, 1)
    r.until(lambda: r.fe.table.get(task.rid).retried)
    r.peers["executor"].send(m.encode(m.Failed(task.rid, "UNAVAILABLE", m.PRE_WORKER_GONE)))
    r.settle()
    assert not r.client.poll(200) and r.fe.table.get(task.rid) is not None
    up(r, PRE0 + 1000)
    sent_alone(r, "a")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [r.slot("pre-0")])))
    r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
    r.peers["executor"].send(m.encode(m.Failed(task.rid, "UNAVAILABLE", m.PRE_WORKER_GONE)))
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"], reply["error"]["message"]) == (
        "a", "UNAVAILABLE", m.PRE_WORKER_GONE)


def test_a_frame_that_travels_twice_is_the_clients_own_both_times(frontend):
    r = frontend()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    first = r.expect("pre-0")[1][1]
    down(r, PRE0, 1)
    up(r, PRE0 + 1000)
    again = r.expect("pre-0")[1][1]
    assert again == first and msgpack.unpackb(again)["inputs"] == TAB
