"""frontend/requests/retries.py on a real table and worker view: who gets a second try, where it may go,
and what waits behind it; the table's counts stay true (holder, stage counts, busy, the hold queue)."""
from __future__ import annotations

import time

from aieng.frontend.control.workers import Workers
from aieng.frontend.requests.retries import Retries
from aieng.frontend.requests.table import CLIENT, EXEC, GOLDEN, PRE, Golden, Request, RequestTable
from aieng.wire import messages as m


def setup(n: int = 2) -> tuple[RequestTable, Workers, Retries, float]:
    table, workers, now = RequestTable(), Workers(), time.monotonic()
    for i in range(n):
        workers.hello(m.Hello(f"pre-{i}", "preprocess", 100 + i), now)
    return table, workers, Retries(table, workers), now


def held(table: RequestTable, worker: str, kind=CLIENT, link=None) -> Request:
    now = time.monotonic()
    req = Request(table.new_rid(), [b"c"] if kind is CLIENT else None, None, "tabhook", "1", now + 5, now, {},
                  body=b"frame", kind=kind, link=link)
    table.add(req)
    table.move(req, PRE, worker)
    return req


def test_what_a_dead_worker_held_waits_for_its_second_try_once_and_the_counts_stay_true():
    table, workers, retries, now = setup()
    a, b = held(table, "pre-0"), held(table, "pre-0")
    golden = held(table, "pre-0", GOLDEN, Golden(lambda body: None, False))
    assert (retries.second_try(a), retries.second_try(b), retries.second_try(golden)) == (True, True, False)
    assert (a.holder, a.stage, a.retried, table.held_by("pre-0"), table.stage_totals[PRE]) == (
        "", PRE, True, [golden.rid], 3)
    assert list(table.waiting[PRE]) == [a.rid, b.rid] and retries.active
    assert not retries.second_try(a)  # once only


def test_a_second_try_goes_only_to_an_idle_worker_and_nothing_goes_beside_it():
    table, workers, retries, now = setup()
    busy = held(table, "pre-1")
    a = held(table, "pre-0")
    retries.second_try(a)
    b = held(table, "pre-0")
    retries.second_try(b)
    fresh = Request(table.new_rid(), [b"c"], None, "tabhook", "1", now + 5, now, {}, body=b"frame")
    assert retries.pick(a, now, lambda w: False) == "pre-0"  # pre-1 holds a request
    table.move(a, PRE, "pre-0")
    retries.sent(a, "pre-0")
    assert retries.pick(b, now, lambda w: False) is None  # pre-0 holds a second try, pre-1 a request
    assert retries.pick(fresh, now, lambda w: False) is None  # behind "b", which waits for its turn
    table.finish(busy.rid)
    assert retries.pick(b, now, lambda w: False) == "pre-1"
    table.move(b, PRE, "pre-1")
    retries.sent(b, "pre-1")
    assert retries.pick(fresh, now, lambda w: False) is None  # every worker holds a second try
    table.move(a, EXEC, "executor")  # "a" was preprocessed: pre-0 takes other work again
    retries.prune()
    assert (retries.pick(fresh, now, lambda w: False), retries.alone) == ("pre-0", {"pre-1": b.rid})
    table.finish(b.rid)
    retries.prune()
    assert not retries.active


def test_a_second_try_answered_while_waiting_waits_no_more():
    table, workers, retries, now = setup()
    a = held(table, "pre-0")
    retries.second_try(a)
    table.finish(a.rid)
    retries.ended(a.rid)
    assert not retries.active
