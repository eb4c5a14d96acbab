"""Reliability v3 (issue 20), the routing state file, each against the real server.

- 10: admin changes are persisted off the loop, each group stored once, the file bounded: after a
  100,000-key group and 16 weight changes the file holds the group once, a restart restores the routing
  exactly, and a routing over the group limit is refused.  A change whose write fails is in force, says so,
  and is saved by the writer's retry once the disk is back; serving goes on meanwhile.  (That the loop
  does not wait for the write is shown without timing in tests/unit/test_state_writer.py.)
- 12: a state directory that cannot be written refuses the start in one line naming AIENG_STATE_DIR, so
  an automatic rollback is never kept in memory only; tests/e2e/test_rollout.py checks that one survives a
  restart.
"""
from __future__ import annotations

import json
import os

import pytest
import zmq

from aieng.frontend.rollout import routing
from aieng.frontend.rollout.routestore import store_path
from tests.e2e.rollout_helpers import PENGUIN, admin_call, metric, start, status, tabular_repo
from tests.waits import until

pytestmark = pytest.mark.e2e

BIG = [f"user-{i:06d}" for i in range(100_000)]


def saved_file(tmp_path, repo) -> str:
    return store_path(str(tmp_path / "state"), str(repo))


def admin_socket(srv):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(srv.admin)
    return sock


def test_a_big_group_is_saved_once_and_restored_exactly(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 100}\n")
    srv = start(make_server, tmp_path, repo)
    admin = admin_socket(srv)
    try:
        rules = admin_call(admin, "set_rules", model="tabular", groups={"big": BIG},
                           rules=[{"name": "big", "group": "big", "version": "2"}])
        assert (rules["ok"], rules["changed"]) == (True, True), rules
        with srv.client() as c:
            for i in range(1, 17):  # each answered once written; requests are served in between
                moved = admin_call(admin, "set_weights", model="tabular", weights={"1": 100 - i, "2": i})
                assert (moved["ok"], moved["changed"]) == (True, True), moved
                member = c.call({"id": i, "model": "tabular", "inputs": PENGUIN, "routing_key": BIG[i]})
                assert (member["version"], member["route"]) == ("2", "rule:big")
        too_big = admin_call(admin, "set_rules", model="tabular", rules=[],  # 100,000 x 46 characters
                             groups={"big": [f"{k}-{'x' * 33}" for k in BIG]})
        assert too_big["ok"] is False and too_big["error"]["code"] == "INVALID_REQUEST"
        assert "over the limit of 4,194,304 for one routing" in too_big["error"]["message"]
    finally:
        admin.close(0)
    before = status(srv, "tabular")
    assert before["weights"] == {"1": 84.0, "2": 16.0} and before["history"] == 16  # nothing refused changed

    with open(saved_file(tmp_path, repo), encoding="utf-8") as fh:
        text = fh.read()
    data = json.loads(text)
    saved = data["models"]["tabular"]
    (digest,) = data["groups"]  # one copy of the group for the 17 states that route with it
    assert data["groups"][digest] == BIG
    assert [s["groups"] for s in [saved["current"]] + saved["history"]] == [{"big": digest}] * 17
    assert text.count('"user-054321"') == 1
    assert len(text) < 2 * len(json.dumps(BIG))  # the group once plus small states, not 17 copies
    assert srv.stop() == 0

    again = start(make_server, tmp_path, repo)
    after = status(again, "tabular")
    for field in ("weights", "ranges", "rules", "groups", "allow_pinned", "history", "previous"):
        assert after[field] == before[field], field
    with again.client() as c:
        member = c.call({"id": "m", "model": "tabular", "inputs": PENGUIN, "routing_key": BIG[54321]})
        other = c.call({"id": "o", "model": "tabular", "inputs": PENGUIN, "routing_key": "not-in-the-group"})
    assert (member["version"], member["route"]) == ("2", "rule:big")
    by_weight = routing.build(None, {"1", "2"}, {"1": 84, "2": 16})
    assert (other["version"], other["route"]) == (by_weight.decide("not-in-the-group", "", None, {}, {})[0],
                                                  "weight")


def test_a_change_whose_write_fails_is_in_force_says_so_and_is_saved_once_the_disk_is_back(make_server,
                                                                                            tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 100}\n")
    srv = start(make_server, tmp_path, repo)
    state, away = tmp_path / "state", tmp_path / "state.away"
    admin = admin_socket(srv)
    try:
        assert admin_call(admin, "set_weights", model="tabular", weights={"1": 90, "2": 10})["ok"]
        os.rename(state, away)
        state.write_text("a file where the state directory was: no write can succeed, not even as root")
        failed = admin_call(admin, "set_weights", model="tabular", weights={"1": 60, "2": 40})
        assert failed["ok"] is False and failed["error"]["code"] == "INTERNAL"
        path = saved_file(tmp_path, repo)
        assert failed["error"]["message"] == (
            f"could not save routing state to {path}: File exists; routing of 'tabular' is in force as "
            "answered but not saved: a restart loses it unless a later write succeeds (retried every 5s)")
        retried = admin_call(admin, "set_weights", model="tabular", weights={"1": 60, "2": 40})
        assert retried["ok"] is False and "not saved" in retried["error"]["message"]  # no change, unsaved
        assert status(srv, "tabular")["weights"] == {"1": 60.0, "2": 40.0}  # in force
        keys = [f"k{i}" for i in range(40)]
        want = routing.build(routing.build(None, {"1", "2"}, {"1": 100}), {"1", "2"}, {"1": 90, "2": 10})
        want = routing.build(want, {"1", "2"}, {"1": 60, "2": 40})
        with srv.client() as c:  # served the new way while nothing can be written
            got = [c.call({"id": k, "model": "tabular", "inputs": PENGUIN, "routing_key": k}) for k in keys]
        assert [(r["ok"], r["version"]) for r in got] == [(True, want.decide(k, "", None, {}, {})[0])
                                                          for k in keys]
        assert metric(srv, "aieng_routing_state_writes_total", outcome="failed") >= 1
        os.unlink(state)
        os.rename(away, state)  # the disk is back: the writer's retry saves it, no new change needed

        def saved_weights() -> dict | None:
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)["models"]["tabular"]["current"]["weights"]

        assert until(lambda: saved_weights() == {"1": 60.0, "2": 40.0}, 30, 0.2), saved_weights()
        ok = admin_call(admin, "set_weights", model="tabular", weights={"1": 60, "2": 40})
        assert (ok["ok"], ok["changed"]) == (True, False)
    finally:
        admin.close(0)
    assert "routing state saved to" in srv.output() and "again, after" in srv.output()


def test_a_state_dir_that_cannot_be_written_is_refused_in_one_line(make_server, tmp_path):
    """Finding 12: with an unwritable state dir an automatic rollback was only logged as not saved, and a
    restart gave the bad canary its weight back.  A path under a regular file cannot be created by anyone,
    root included (the tests run as root, where a mode-0500 directory would not stop a write)."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    state = afile / "state"
    srv = make_server(AIENG_MODELS="tabular", AIENG_STATE_DIR=str(state)).start(wait=False)
    assert srv.proc.wait(60) == 2
    lines = [json.loads(line)["msg"] for line in srv.output().splitlines() if line.startswith("{")]
    assert lines[-1] == (f"invalid configuration: AIENG_STATE_DIR {str(state)!r} cannot be written: Not a "
                         "directory (from env:AIENG_STATE_DIR); routing changes and automatic rollbacks "
                         "would be lost at a restart: set AIENG_STATE_DIR to a directory this user can write")
    assert [x for x in lines if "AIENG_STATE_DIR" in x] == lines[-1:]
    assert "Traceback" not in srv.output()
