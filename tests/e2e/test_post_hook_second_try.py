"""Issue 36: one request that crashes a postprocess hook's worker costs only itself: every other request in
flight at that moment is answered OK, with its own values.

One postprocess worker (AIENG_POSTPROCESS_WORKERS=1), so the crashing request and the good ones share it:
drained with it (answered before it but maybe not yet sent, or not yet run) or on their way to it.  What a
dead postprocess worker held, or what was on its way to it, gets a second try on its replacement, one at a
time (frontend/requests/retries.py; the executor sends the task again: ``m.Repost``).  The crashing request
crashes the replacement too and fails UNAVAILABLE naming the exit (two restarts).  The hook model is
test_post_hook's ``tabular_py`` (``exit_after_s`` calls ``os._exit(3)``), whose answers equal the built-in
``tabular``'s.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil

import numpy as np
import pytest

from aieng.client import AsyncClient
from tests.conftest import MODELS
from tests.e2e.test_post_hook import hook_model
from tests.waits import until

pytestmark = pytest.mark.e2e
GOOD = 24  # good requests beside the crashing one: under the per-client limit


def rows() -> list[dict]:
    with open(os.path.join(MODELS, "tabular", "1", "reference.json")) as fh:
        cases = [case["input"] for case in json.load(fh)["cases"]]
    return [cases[i % len(cases)] for i in range(GOOD)]


async def at_once(addr: str, requests: list[dict]) -> dict[str, dict]:
    """Every request sent at the same moment on one connection; the replies by their ids."""
    client = AsyncClient(addr, timeout_s=60)
    try:
        replies = await asyncio.gather(*(client.call(r, raise_on_error=False) for r in requests))
    finally:
        client.close()
    return {r["id"]: r for r in replies}


def outcome(reply: dict) -> tuple:
    return ("OK",) if reply["ok"] else (reply["error"]["code"], reply["error"]["message"])


def restarts(srv) -> int:
    return srv.health()["restarts"].get("postprocess", 0)


def test_a_crash_in_post_fails_only_its_request_and_every_request_beside_it_is_answered(make_server,
                                                                                         tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(os.path.join(MODELS, "tabular"), repo / "tabular")
    hook_model(repo)
    marks = tmp_path / "marks"
    marks.mkdir()
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_ALLOW_MODEL_CODE="1",
                      AIENG_POSTPROCESS_WORKERS="1", POSTHOOK_MARKS=str(marks)).start()
    with srv.client() as c:  # the built-in chain's answers to the same rows: what the hook's must equal
        want = [c.infer("tabular", r)["outputs"] for r in rows()]
    goods = [{"op": "infer", "id": f"good-{i}", "model": "tabular_py", "inputs": r, "timeout_ms": 30000}
             for i, r in enumerate(rows())]
    crash = {"op": "infer", "id": "crash", "model": "tabular_py", "inputs": rows()[0], "timeout_ms": 30000,
             "params": {"exit_after_s": 0}}
    # the crash among them: goods batched and drained with it (before it, after it), the rest on their way
    replies = asyncio.run(at_once(srv.addr, goods[:GOOD // 2] + [crash] + goods[GOOD // 2:]))

    assert outcome(replies["crash"]) == ("UNAVAILABLE", "post-0 exited (code 3) while holding the request")
    got = [replies[f"good-{i}"] for i in range(GOOD)]
    assert [outcome(r) for r in got] == [("OK",)] * GOOD
    assert [r["outputs"]["label"] for r in got] == [w["label"] for w in want]
    np.testing.assert_allclose([r["outputs"]["probabilities"] for r in got],
                               [w["probabilities"] for w in want], atol=1e-6)
    # the crash cost two workers: its own first, then the replacement its second try ran on
    assert until(lambda: restarts(srv) == 2 and srv.health()["ready"], 30), srv.health()
    with srv.client() as c:  # the replaced worker serves the hook again
        assert c.infer("tabular_py", rows()[0])["outputs"]["label"] == want[0]["label"]
    assert restarts(srv) == 2
