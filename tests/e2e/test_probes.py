"""Probes an orchestrator can trust, against the real server.

/healthz (liveness) means the supervisor and the frontend are alive and making progress: it stays
200 while a worker restarts (recovery, not death) and fails when the frontend is stopped or the
supervisor's loop is wedged.  /readyz means every role is up and every model warm; /startupz turns
true once the first warm-up is done.
"""
from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.e2e


def code_of(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status, or None when nothing answered within ``timeout``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return None


def test_liveness_stays_up_while_the_executor_restarts(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    assert code_of(srv.http + "/startupz") == 200
    os.kill(srv.child_pid("aieng::executor"), signal.SIGKILL)
    live, ready = [], []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        live.append(code_of(srv.http + "/healthz"))
        ready.append(code_of(srv.http + "/readyz"))
        if 503 in ready and ready[-1] == 200:
            break
        time.sleep(0.05)
    assert 503 in ready and ready[-1] == 200  # readiness went down and came back
    assert set(live) == {200}, live  # liveness never did
    assert code_of(srv.http + "/startupz") == 200


def test_liveness_fails_when_the_frontend_is_stopped(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    fe = srv.child_pid("aieng::frontend")
    assert code_of(srv.http + "/healthz") == 200
    os.kill(fe, signal.SIGSTOP)
    try:
        assert code_of(srv.http + "/healthz", timeout=2.0) is None  # a stopped frontend answers nothing
    finally:
        os.kill(fe, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while code_of(srv.http + "/healthz") != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert code_of(srv.http + "/healthz") == 200


def test_liveness_fails_when_the_supervisor_is_wedged(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    assert code_of(srv.http + "/healthz") == 200
    os.kill(srv.pid, signal.SIGSTOP)
    codes = []
    try:
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            codes.append(code_of(srv.http + "/healthz"))
            if codes[-1] == 503:
                break
            time.sleep(0.2)
    finally:
        os.kill(srv.pid, signal.SIGCONT)
    assert codes[-1] == 503, codes  # no word from the supervisor for longer than the staleness bound
    deadline = time.monotonic() + 10
    while code_of(srv.http + "/healthz") != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert code_of(srv.http + "/healthz") == 200
