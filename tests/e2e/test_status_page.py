"""The probe port's live status page (issue 38): the feed (/status.json) counts the requests a client made,
per model and version, with the processes' CPU and memory; with AIENG_HTTP_TOKEN_FILE set the feed needs
the token and the page shell does not (in a browser: the page shows the 401, asks for the token and keeps it
in sessionStorage); and a real browser (headless Chromium, tests/browser.py) shows the count and the
processes.  With AIENG_SCREENSHOTS=1 the browser test saves docs/img/status.png."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.rollout_helpers import PENGUIN, start, tabular_repo
from tests.e2e.test_http_hardening import get
from tests.waits import until

pytestmark = pytest.mark.e2e
N = 12
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT, MODELS = ROOT / "docs" / "img" / "status.png", ROOT / "models"


def feed(srv, token: str | None = None) -> dict:
    code, _, body = get(srv.http + "/status.json", token)
    assert code == 200, body
    return json.loads(body)


def model_row(status: dict, name: str) -> dict:
    return {m["name"]: m for m in status["models"]}[name]


def counted(srv, name: str, n: int, token: str | None = None):
    """The feed once it shows ``n`` requests of ``name`` in its last minute and every process's CPU."""
    def ready():
        status = feed(srv, token)
        traffic = model_row(status, name)["traffic"]
        cpu_known = all(p["cpu_percent"] is not None for p in status["processes"])
        return status if traffic and traffic["requests"] == n and cpu_known else None
    return until(ready, timeout_s=15, step_s=0.2)


def test_feed_counts_the_requests_made(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    with srv.client() as c:
        for i in range(N):
            c.infer("tabular", {"island": "Dream", "bill_length_mm": 40 + i})
    status = counted(srv, "tabular", N)
    assert status, feed(srv)
    tab = model_row(status, "tabular")
    assert (tab["traffic"]["requests"], tab["traffic"]["errors"]) == (N, 0)
    assert 0 < tab["traffic"]["p50_ms"] <= tab["traffic"]["p99_ms"] and tab["traffic"]["rps"] > 0
    (version,) = tab["versions"]
    assert (version["version"], version["state"], version["share"], version["stable"]) == ("1", "ready", 1.0,
                                                                                            True)
    assert version["traffic"]["requests"] == N and tab["canary"]["versions"] == []
    assert tab["timings"]["requests"] == N and tab["timings"]["total_p50_us"] > 0
    assert status["server"]["ready"] is True and status["server"]["in_flight"] == 0
    procs = {p["role"]: p for p in status["processes"]}
    assert {"frontend", "executor", "preprocess", "postprocess"} <= set(procs)
    executor = procs["executor"]
    assert executor["alive"] is True and executor["pid"] > 0 and executor["rss_bytes"] > 10 * 2**20
    assert executor["cpu_percent"] >= 0


def test_feed_shows_the_canary_and_each_version_s_minute(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 80, '2': 20}\n"
                       "  auto_rollback: {max_error_rate_delta: 0.05, window_s: 60}\n")
    srv = start(make_server, tmp_path, repo)
    with srv.client() as c:
        for version, n in (("1", 7), ("2", 5)):
            for _ in range(n):  # pinned: each version's count is known
                reply = c.call({"op": "infer", "id": 1, "model": "tabular", "inputs": dict(PENGUIN),
                                "version": version})
                assert reply["version"] == version
    status = counted(srv, "tabular", 12)
    assert status, feed(srv)
    tab = model_row(status, "tabular")
    rows = {v["version"]: v for v in tab["versions"]}
    assert {v: (r["state"], r["share"], r["stable"], r["traffic"]["requests"]) for v, r in rows.items()} == {
        "1": ("ready", 0.8, True, 7), "2": ("ready", 0.2, False, 5)}
    assert (tab["stable"], tab["canary"]["versions"], tab["canary"]["auto_rollback"]) == ("1", ["2"], True)


def test_feed_needs_the_token_and_the_page_shell_does_not(make_server, tmp_path):
    token_file = tmp_path / "http-token"
    token_file.write_text("s3cret-token\n")
    srv = make_server(AIENG_MODELS="tabular", AIENG_HTTP_TOKEN_FILE=str(token_file)).start()
    code, headers, body = get(srv.http + "/status.json")
    assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert json.loads(body) == {"error": "unauthorized"}
    assert get(srv.http + "/status.json", "wrong")[0] == 401
    assert feed(srv, "s3cret-token")["server"]["ready"] is True
    code, headers, body = get(srv.http + "/")
    assert code == 200 and headers["Content-Type"].startswith("text/html") and b"/status.js" in body
    for path in ("/healthz", "/readyz", "/startupz"):
        assert get(srv.http + path)[0] == 200


@pytest.mark.browser  # run after the rest, alone (scripts/test.sh)
def test_browser_asks_for_the_token_and_keeps_it_for_the_tab(make_server, tmp_path):
    from selenium.webdriver.common.by import By

    from tests.browser import chrome, text_when, wait_for

    token_file = tmp_path / "http-token"
    token_file.write_text("s3cret-token\n")
    srv = make_server(AIENG_MODELS="tabular", AIENG_HTTP_TOKEN_FILE=str(token_file)).start()
    with chrome(tmp_path) as d:
        d.get(srv.http + "/")
        said = text_when(d, "#message", lambda t: t.startswith("401"))
        assert said == "401 unauthorized: enter the token"  # the server's words
        wait_for(d, "#token").send_keys("s3cret-token")
        d.find_element(By.CSS_SELECTOR, "#token-form button").click()
        wait_for(d, '#models tr[data-model="tabular"][data-version="1"]')
        assert d.execute_script("return sessionStorage.getItem('aieng-status-token')") == "s3cret-token"
        assert d.find_element(By.CSS_SELECTOR, "#message").is_displayed() is False


@pytest.mark.browser  # run after the rest, alone (scripts/test.sh)
def test_browser_sees_the_requests_counted_and_the_processes(make_server, tmp_path):
    from tests.browser import chrome, text_when, wait_for

    repo = tmp_path / "repo"  # tabular 1 and a canary 2 (the screenshot shows one), and minilm
    tabular_repo(repo, "routing:\n  weights: {'1': 90, '2': 10}\n"
                       "  auto_rollback: {max_error_rate_delta: 0.05, window_s: 60}\n")
    (repo / "minilm").symlink_to(MODELS / "minilm")
    srv = start(make_server, tmp_path, repo)
    with chrome(tmp_path) as d:
        d.get(srv.http + "/")
        wait_for(d, '#models tr[data-model="tabular"]')
        with srv.client() as c:
            for i in range(N):  # every fourth to the canary, pinned
                c.call({"op": "infer", "id": i, "model": "tabular", "version": "2" if i % 4 == 0 else "1",
                        "inputs": {"island": "Dream", "bill_length_mm": 40 + i}})
            for text in ("a status page", "counts what it serves", "every second"):
                c.infer("minilm", {"text": text})
        cell = '#models tr[data-model="tabular"][data-version=""] td.requests'
        assert text_when(d, cell, lambda t: t == str(N), timeout=20) == str(N)
        canary = '#models tr[data-model="tabular"][data-version="2"] td.requests'
        assert text_when(d, canary, lambda t: t == str(N // 4)) == str(N // 4)
        assert text_when(d, '#models tr[data-model="minilm"][data-version=""] td.requests',
                         lambda t: t == "3", timeout=20) == "3"
        assert text_when(d, '#models tr[data-model="tabular"][data-version="2"] td:nth-child(3)',
                         lambda t: t == "ready") == "ready"
        assert text_when(d, '#models tr[data-model="tabular"][data-version="2"] td:nth-child(5)',
                         lambda t: t != "") == "canary, watched"
        assert text_when(d, "#server-state", lambda t: t.startswith("ready")).startswith("ready")
        executor = '#processes tr[data-process="executor"] td.rss'
        assert float(text_when(d, executor, lambda t: t.replace(".", "", 1).isdigit())) > 10
        assert text_when(d, '#stages tr[data-model="tabular"] td:nth-child(2)',
                         lambda t: t not in ("", "–")) != ""
        if os.environ.get("AIENG_SCREENSHOTS") == "1":  # the docs' picture, made on request only
            text_when(d, '#processes tr[data-process="executor"] td.cpu', lambda t: t != "–")
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            d.save_screenshot(str(SCREENSHOT))
