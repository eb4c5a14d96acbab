"""The status page's feed (``observe/statuspage.feed``) from a published snapshot, and the page on the probe
port: the shell and its files load without the token, the feed needs it, nothing external is allowed."""
from __future__ import annotations

import json
import time

import pytest

from aieng.frontend.observe.http import HttpServer
from aieng.frontend.observe.statuspage import MAX_DRIFT_ROWS, feed, load_assets
from tests.conftest import free_port
from tests.unit.test_http import http_get


def snapshot() -> dict:
    now = time.monotonic()
    traffic = {"requests": 30, "errors": 1, "rps": 0.5, "p50_ms": 2.0, "p99_ms": 9.0, "window_s": 60.0}
    return {
        "published_at": now, "supervisor_seen_at": now, "in_flight": 3,
        "queue_depth": {"preprocess": 1, "executor": 2},
        "counts": {"requests": 31, "ok": 30, "errors": {"TIMEOUT": 1}},
        "health": {"live": True, "ready": True, "started": True, "degraded": False, "draining": False,
                   "version": "0.1.0", "uptime_s": 12.5,
                   "providers": {"tab:1": "CPUExecutionProvider", "tab:2": "CPUExecutionProvider"},
                   "failed_models": {"tab:3": "bad graph", "gone": "no model.onnx"},
                   "processes": {"executor": {"role": "executor", "pid": 11, "alive": True, "restarts": 0},
                                 "pre-0": {"role": "preprocess", "pid": 12, "alive": False, "restarts": 2}}},
        "models": {"tab": {"1": {"hash": "a" * 64, "metadata": {}}, "2": {"hash": "b" * 64, "metadata": {}},
                           "3": {"hash": "c" * 64, "metadata": {}}}},
        "routing": {"tab": {"weights": {"1": 90, "2": 10}, "stable": "1", "reason": "canary 10%",
                            "auto_rollback": True, "events": [{"kind": "weights", "at": 1.0}]}},
        "traffic": {"tab": {"": traffic, "1": dict(traffic, requests=27), "2": dict(traffic, requests=3)}},
        "stats": {"models": {"tab": {"requests": 30, "stages_us": {
            "preprocess": {"p50": 100.0, "p95": 1, "p99": 1, "mean": 1, "share": 0.25},
            "inference": {"p50": 300.0, "p95": 1, "p99": 1, "mean": 1, "share": 0.75},
            "total": {"p50": 400.0, "p95": 1, "p99": 900.0, "mean": 1, "share": 1.0}}}}},
        "drift_psi": {f"tab/1/f{i}": i / 100 for i in range(MAX_DRIFT_ROWS + 10)},
        "memory": {"executor": 100 * 2**20}, "cpu": {"executor": 12.5}, "gpus": {}}


def test_feed_shows_versions_routing_canary_traffic_stages_drift_and_processes():
    out = json.loads(json.dumps(feed(snapshot())))  # what goes on the wire is plain JSON
    server = out["server"]
    assert (server["ready"], server["in_flight"], server["queue_depth"]) == (True, 3, {"preprocess": 1,
                                                                                       "executor": 2})
    tab, gone = out["models"]
    assert (tab["name"], tab["stable"], gone["name"], gone["error"]) == ("tab", "1", "gone", "no model.onnx")
    rows = {v["version"]: v for v in tab["versions"]}
    assert [rows[v]["state"] for v in ("1", "2", "3")] == ["ready", "ready", "failed"]
    assert rows["3"]["error"] == "bad graph" and rows["1"]["hash"] == "a" * 12
    assert (rows["1"]["weight"], rows["2"]["weight"], rows["3"]["weight"]) == (90, 10, 0.0)
    assert (rows["1"]["share"], rows["2"]["share"], rows["3"]["share"]) == (0.9, 0.1, 0.0)
    assert (rows["1"]["stable"], rows["2"]["stable"]) == (True, False)
    assert tab["canary"] == {"versions": ["2"], "auto_rollback": True, "reason": "canary 10%",
                             "last_event": {"kind": "weights", "at": 1.0}}
    assert tab["traffic"]["requests"] == 30 and rows["2"]["traffic"]["requests"] == 3
    assert rows["3"]["traffic"] is None
    assert tab["timings"]["stages"] == [{"stage": "preprocess", "p50_us": 100.0, "share": 0.25},
                                        {"stage": "inference", "p50_us": 300.0, "share": 0.75}]
    assert (tab["timings"]["total_p50_us"], tab["timings"]["total_p99_us"]) == (400.0, 900.0)
    assert len(out["drift"]) == MAX_DRIFT_ROWS and out["drift"][0] == {"key": f"tab/1/f{MAX_DRIFT_ROWS + 9}",
                                                                        "psi": (MAX_DRIFT_ROWS + 9) / 100}
    assert out["processes"] == [
        {"name": "executor", "role": "executor", "pid": 11, "alive": True, "restarts": 0,
         "cpu_percent": 12.5, "rss_bytes": 100 * 2**20},
        {"name": "pre-0", "role": "preprocess", "pid": 12, "alive": False, "restarts": 2,
         "cpu_percent": None, "rss_bytes": None}]


def test_feed_of_an_empty_snapshot():
    """Before the loop's first publish the snapshot is empty: the feed still answers."""
    out = feed({})
    assert out["models"] == [] and out["processes"] == [] and out["server"]["ready"] is False


@pytest.fixture
def probe(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    port = free_port()
    snap = snapshot()
    srv = HttpServer(f"127.0.0.1:{port}", lambda: snap, lambda: b"m 1\n", token_file=str(token))
    yield srv, port
    srv.close()


def test_page_loads_without_the_token_and_the_feed_needs_it(probe):
    srv, port = probe
    assets = load_assets()
    for path, ctype in (("/", "text/html"), ("/status.js", "text/javascript"), ("/status.css", "text/css")):
        code, headers, body = http_get(port, path)
        assert (code, body) == (200, assets[path][0])
        assert headers["content-type"].startswith(ctype)
        assert headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
        assert headers["x-content-type-options"] == "nosniff"
    code, headers, body = http_get(port, "/status.json")
    assert code == 401 and headers["www-authenticate"].startswith("Bearer")
    assert json.loads(body) == {"error": "unauthorized"}
    assert http_get(port, "/status.json", {"Authorization": "Bearer nope"})[0] == 401
    srv.debug_asked.clear()
    code, headers, body = http_get(port, "/status.json", {"Authorization": "Bearer s3cret"})
    assert code == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == json.loads(json.dumps(feed(srv.snapshot())))
    assert srv.debug_asked.is_set()  # the stage timings are refreshed while someone watches
    assert http_get(port, "/healthz")[0] == 200  # the probes stay open


def test_page_loads_nothing_from_elsewhere():
    for path, (body, _) in load_assets().items():
        text = body.decode()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path
    html = load_assets()["/"][0].decode()
    assert '<script src="/status.js"' in html and '<link rel="stylesheet" href="/status.css">' in html
