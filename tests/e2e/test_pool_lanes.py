"""Pool lanes (``wire/lanes``, ``AIENG_POOL_LANES``): the data path's messages between the frontend, the pools
and the executor go on Unix sequential-packet sockets, counted by each process and shown by ``health``.

The built-in ``tabular`` with the executor's own routes off, so every request takes every hop: frontend ->
pre-N -> executor -> post-0 -> frontend.  With lanes on, each hop carried the requests and nothing fell back;
with them off every answer is the same and nothing went on a lane; a postprocess worker killed and restarted
is connected to again and serves on its lane.
"""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from aieng.client import AsyncClient
from tests.waits import until

pytestmark = pytest.mark.e2e

EVERY_HOP = {"AIENG_MODELS": "tabular", "AIENG_PREPROCESS_WORKERS": "2", "AIENG_POSTPROCESS_WORKERS": "1",
             "AIENG_INLINE_PREPROCESS_BYTES": "0", "AIENG_INLINE_POSTPROCESS_US": "0"}
N = 40


def rows(n: int, tag: str) -> list[dict]:
    return [{"op": "infer", "id": f"{tag}-{i}", "model": "tabular",
             "inputs": {"island": "Biscoe", "bill_length_mm": 35.0 + i % 20, "sex": "female"}}
            for i in range(n)]


def answers(addr: str, tag: str) -> list[tuple[str, bool, str]]:
    """``N`` requests at once on one connection: ``(id, ok, label)`` each, in the order sent."""
    async def go():
        client = AsyncClient(addr, timeout_s=30)
        try:
            return await asyncio.gather(*(client.call(r, raise_on_error=False) for r in rows(N, tag)))
        finally:
            client.close()

    return [(r["id"], r["ok"], r["outputs"]["label"] if r["ok"] else r["error"]["message"])
            for r in asyncio.run(go())]


def lane_counts(srv, enough) -> dict:
    """``health``'s lanes once ``enough(lanes)`` holds (the workers' counts come with their heartbeats)."""
    return until(lambda: (lanes := (srv.health() or {}).get("lanes")) and enough(lanes) and lanes, 10)


def test_every_hop_takes_its_lane_and_nothing_falls_back(make_server):
    srv = make_server(**EVERY_HOP).start()
    got = answers(srv.addr, "a")
    assert [g[0] for g in got] == [f"a-{i}" for i in range(N)]
    assert [g[1] for g in got] == [True] * N
    def facts(lanes: dict) -> dict:
        pre = [c for n, c in lanes.items() if n.startswith("pre-")]
        ex, post = lanes.get("executor", {}), lanes.get("post-0", {})
        return {"frontend sent": lanes["frontend"]["sent"] >= N,  # each request's task to a preprocess worker
                "pre received": sum(c["received"] for c in pre) >= N,
                "pre sent": sum(c["sent"] for c in pre) >= N,  # each one's InferTask (and the notices)
                "executor received": ex.get("received", 0) >= N,
                "executor sent": ex.get("sent", 0) >= 1, "post received": post.get("received", 0) >= 1,
                "post sent": post.get("sent", 0) >= 1,  # a drain's answers, bundled
                "frontend received": lanes["frontend"]["received"] >= 1}

    # the workers' counts come with their heartbeats, a second apart each
    lanes = lane_counts(srv, lambda ln: all(facts(ln).values()))
    assert lanes, srv.health()["lanes"]
    assert facts(lanes) == {k: True for k in facts(lanes)}, lanes
    assert {n: c["fell_back"] for n, c in lanes.items()} == {n: 0 for n in lanes}


def test_with_lanes_off_the_same_answers_come_by_zeromq(make_server):
    on = make_server(**EVERY_HOP).start()
    with_lanes = answers(on.addr, "b")
    on.stop()
    off = make_server(**EVERY_HOP, AIENG_POOL_LANES="0").start()
    without = answers(off.addr, "b")
    assert without == with_lanes
    assert [g[1] for g in without] == [True] * N
    lanes = off.health()["lanes"]
    assert {n: c for n, c in lanes.items() if any(c.values())} == {}


def test_a_restarted_postprocess_worker_is_served_on_its_lane_again(make_server):
    srv = make_server(**EVERY_HOP).start()
    assert [g[1] for g in answers(srv.addr, "c")] == [True] * N
    old = srv.child_pid("aieng::postprocess")
    os.kill(old, signal.SIGKILL)
    assert until(lambda: (h := srv.health()) and h["ready"] and h["processes"]["post-0"]["alive"]
                 and h["processes"]["post-0"]["pid"] != old, 30)
    assert [g[1] for g in answers(srv.addr, "d")] == [True] * N
    # the new process's own counts: what it received came on its lane (the executor connected again)
    lanes = lane_counts(srv, lambda ln: ln.get("post-0", {}).get("received", 0) >= 1
                        and srv.health()["processes"]["post-0"]["pid"] != old)
    assert lanes["post-0"]["received"] >= 1
    assert lanes["post-0"]["sent"] >= 1
