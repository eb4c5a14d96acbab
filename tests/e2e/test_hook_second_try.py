"""Issue 36: one request that crashes a hook's worker, or hangs it, costs only itself: every other request in
flight at that moment is answered OK, with its own values.

One preprocess worker (AIENG_PREPROCESS_WORKERS=1), so the misbehaving request and the good ones are drained
together or queued behind it in that worker: what a dead worker held at PRE gets a second try, alone on the
restarted worker (frontend/requests/retries.py).  The crashing request crashes its second worker too and
fails UNAVAILABLE naming the exit (two restarts); the hung one is answered TIMEOUT at its deadline, is not
sent again, and its worker is replaced at AIENG_PREPROCESS_BUDGET_MS (one restart).  The hook models are
test_python_pre's (``mode``: ``crash`` calls ``os._exit(1)``, ``hang`` sleeps): ``tabhook`` runs ``pre`` per
request, ``tabbatch`` hands the worker's drain to ``batch``.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aieng.client import AsyncClient
from tests.e2e.test_python_pre import hook_repo, outcome, rows
from tests.waits import until

pytestmark = pytest.mark.e2e
GOOD = 24  # good requests beside the misbehaving one: under the per-client limit


async def at_once(addr: str, requests: list[dict]) -> dict[str, dict]:
    """Every request sent at the same moment on one connection; the replies by their ids."""
    client = AsyncClient(addr, timeout_s=60)
    try:
        replies = await asyncio.gather(*(client.call(r, raise_on_error=False) for r in requests))
    finally:
        client.close()
    return {r["id"]: r for r in replies}


def good_requests(model: str, timeout_ms: int | None = None) -> list[dict]:
    extra = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    return [{"op": "infer", "id": f"good-{i}", "model": model, "inputs": r, **extra}
            for i, r in enumerate(rows(GOOD))]


def builtin_answers(srv) -> list[dict]:
    """The built-in ``tabular`` model's answers to the same rows: what the hook's must equal."""
    with srv.client() as c:
        return [c.infer("tabular", r)["outputs"] for r in rows(GOOD)]


def check_goods(replies: dict[str, dict], want: list[dict]) -> None:
    goods = [replies[f"good-{i}"] for i in range(GOOD)]
    assert [outcome(r) for r in goods] == [("OK",)] * GOOD
    assert [r["outputs"]["label"] for r in goods] == [w["label"] for w in want]
    np.testing.assert_allclose([r["outputs"]["probabilities"] for r in goods],
                               [w["probabilities"] for w in want], atol=1e-6)


def restarts(srv) -> int:
    return srv.health()["restarts"].get("preprocess", 0)


@pytest.mark.parametrize("model", ["tabhook", "tabbatch"])
def test_a_crash_fails_only_its_request_and_every_request_beside_it_is_answered(make_server, tmp_path, model):
    srv = make_server(AIENG_MODEL_REPOSITORY=hook_repo(tmp_path, timeout_ms=30000),
                      AIENG_ALLOW_MODEL_CODE="1", AIENG_PREPROCESS_WORKERS="1").start()
    want = builtin_answers(srv)
    goods = good_requests(model)
    crash = {"op": "infer", "id": "crash", "model": model, "inputs": {"mode": "crash"}}
    # the crash among them: some goods drained with it (before it, after it), the rest queued behind it
    replies = asyncio.run(at_once(srv.addr, goods[:GOOD // 2] + [crash] + goods[GOOD // 2:]))
    assert outcome(replies["crash"]) == ("UNAVAILABLE", "pre-0 exited (code 1) while holding the request")
    check_goods(replies, want)
    # the crash cost two workers: its own first, then the restarted one its second try ran on (alone)
    assert until(lambda: restarts(srv) == 2 and srv.health()["ready"], 30), srv.health()
    with srv.client() as c:  # the replaced worker serves the hook again
        assert c.infer(model, rows(1)[0])["outputs"]["label"] == want[0]["label"]
    assert restarts(srv) == 2


def test_a_hang_fails_only_its_request_and_every_request_queued_behind_it_is_answered(make_server, tmp_path):
    # the model's timeout_ms (1 s) under the budget (1.5 s): the hung request is answered TIMEOUT first, then
    # its worker is replaced at the budget holding the good ones queued behind it (their own timeout_ms 30 s)
    srv = make_server(AIENG_MODEL_REPOSITORY=hook_repo(tmp_path, timeout_ms=1000), AIENG_ALLOW_MODEL_CODE="1",
                      AIENG_PREPROCESS_WORKERS="1", AIENG_PREPROCESS_BUDGET_MS="1500",
                      AIENG_HANG_TIMEOUT_S="60").start()
    want = builtin_answers(srv)
    hang = {"op": "infer", "id": "hang", "model": "tabhook", "inputs": {"mode": "hang"}}
    replies = asyncio.run(at_once(srv.addr, [hang] + good_requests("tabhook", timeout_ms=30000)))
    assert outcome(replies["hang"]) == ("TIMEOUT", "no answer within the deadline (stage: preprocess)")
    check_goods(replies, want)
    assert until(lambda: restarts(srv) == 1 and srv.health()["ready"], 30), srv.health()
    assert "AIENG_PREPROCESS_BUDGET_MS (1500 ms): stuck, replacing it" in srv.output()
    with srv.client() as c:
        assert c.infer("tabhook", rows(1)[0])["outputs"]["label"] == want[0]["label"]
    assert restarts(srv) == 1
