"""A request answered while its preprocess worker still runs it (a deadline passed inside a hook) keeps that
worker ``busy`` (frontend/requests/table.py) until the worker hands it on, fails it or dies: the stall, stuck
and routing rules count it, so a hung worker is replaced at the budget and nothing is routed behind it."""
from __future__ import annotations

import time

from aieng.frontend.requests.table import CLIENT, EXEC, PRE, Request, RequestTable
from aieng.wire.messages import Ref


def held(table: RequestTable, worker: str) -> Request:
    now = time.monotonic()
    req = Request(table.new_rid(), [b"client"], None, "tabhook", "1", now + 5, now, {}, kind=CLIENT)
    table.add(req)
    table.move(req, PRE, worker)
    return req


def test_a_timed_out_request_keeps_its_worker_busy_until_it_is_handed_on_or_failed():
    table = RequestTable()
    a, b = held(table, "pre-0"), held(table, "pre-0")
    assert (table.load("pre-0"), table.busy("pre-0")) == (2, 2)
    table.finish(a.rid, ghost=True)  # its deadline: answered TIMEOUT, the worker still on it
    table.finish(b.rid, ghost=True)
    assert (table.load("pre-0"), table.busy("pre-0")) == (0, 2)
    ref = Ref("seg", 0, 1, [])
    assert table.ghost_passed(a.rid, b"pre-0", EXEC, ref) is not None  # it finished and handed it on
    assert table.busy("pre-0") == 1
    table.unhaunt(b.rid)  # a Failed for it
    assert table.busy("pre-0") == 0 and table.pre_ghosts == {}
    c = held(table, "pre-1")
    table.finish(c.rid, ghost=True)
    assert table.busy("pre-1") == 1
    table.ghosts_of("pre-1")  # it died
    assert table.busy("pre-1") == 0 and table.pre_ghosts == {}
