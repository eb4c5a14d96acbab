"""The request table counts each entry by its kind: a client's request is counted per client, a shadow copy
and a pipeline step are internal (out of admission's in-flight limit), a golden case takes a client's place
but belongs to no client, and ``per_model`` (degradation, unload drains) leaves out shadow copies only."""
from __future__ import annotations

import time

from aieng.frontend.requests.table import CLIENT, GOLDEN, SHADOW, STEP, Golden, Request, RequestTable, Step


def entry(table: RequestTable, kind, link=None, envelope=None) -> Request:
    now = time.monotonic()
    req = Request(table.new_rid(), envelope, None, "tabular", "1", now + 5, now, {}, kind=kind, link=link)
    table.add(req)
    return req


def test_each_kind_is_counted_where_it_belongs_and_leaves_no_count_behind():
    table = RequestTable()
    client = entry(table, CLIENT, envelope=[b"client-a"])
    assert client.kind is CLIENT and not client.internal
    entry(table, GOLDEN, Golden(lambda body: None, background=True))
    entry(table, SHADOW, client.rid)
    entry(table, STEP, Step(client.rid, None))
    assert (len(table), table.shadows, table.client_load(b"client-a")) == (4, 2, 1)
    assert table.per_model() == {"tabular:1": 3}  # the shadow copy is the mirror's to shed
    for rid in list(table.items):
        table.finish(rid)
    assert (len(table), table.shadows, table.by_client) == (0, 0, {})
    table.close()
