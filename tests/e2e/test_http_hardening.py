"""The HTTP side cannot hurt the data path: /debug load costs the loop one summary per period, half-open
connections cost no threads and are dropped quietly on time, bearer-token auth, /debug with CURVE on,
and a busy HTTP port named in the start failure."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest
import zmq
import zmq.auth
from prometheus_client.parser import text_string_to_metric_families

from aieng.client import AsyncClient, Client
from aieng.frontend.observe.stats import WINDOW
from tests.conftest import free_port
from tests.waits import until

pytestmark = pytest.mark.e2e



def still_open(s: socket.socket) -> bool:
    """The server has not closed ``s``: nothing to read yet, not EOF."""
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    finally:
        s.setblocking(True)

def get(url: str, token: str | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def dropped(base: str, reason: str) -> float:
    code, _, body = get(base + "/metrics")
    assert code == 200
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == "aieng_http_dropped_connections_total" and s.labels == {"reason": reason}:
                return s.value
    raise AssertionError("aieng_http_dropped_connections_total{reason=%r} missing" % reason)


def fill_stats_window(addr: str, n: int) -> None:
    """``n`` tabular requests, 64 at a time: the frontend's stage-stats windows as full as in a server that
    has run a while (the summary /debug shows costs in proportion; with empty windows it is free)."""
    async def run() -> None:
        client = AsyncClient(addr, timeout_s=60)
        sem = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with sem:
                await client.infer("tabular", {"island": "Dream", "bill_length_mm": 30.0 + i % 30})
        try:
            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 180)
        finally:
            client.close()

    asyncio.run(run())


SNAPSHOT_MS = 400


def test_debug_loops_make_the_loop_summarise_at_most_once_per_snapshot(make_server):
    """Four clients polling /debug as fast as they can cost the frontend loop one stage summary per
    snapshot period, not one per request: the answers carry at most as many distinct ``stats_at`` as
    periods went by, and inference is answered beside them."""
    srv = make_server(AIENG_MODELS="minilm,tabular", AIENG_SNAPSHOT_MS=str(SNAPSHOT_MS)).start()
    fill_stats_window(srv.addr, WINDOW)
    # the first /debug asks; a summary follows at the next period
    assert until(lambda: json.loads(get(srv.http + "/debug")[2]).get("stats_at") is not None, 10)
    stop = threading.Event()
    seen: list[list[float]] = [[] for _ in range(4)]
    failed: list[str] = []

    def loop(k: int) -> None:
        deadline = time.monotonic() + 10  # bounded in time whatever happens
        while not stop.is_set() and time.monotonic() < deadline:
            code, _, body = get(srv.http + "/debug")
            doc = json.loads(body) if code == 200 else {}
            if code != 200 or not doc.get("stats") or doc.get("stats_at") is None:
                failed.append(f"{code} {sorted(doc)}")
            else:
                seen[k].append(doc["stats_at"])

    loops = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(4)]
    t0 = time.monotonic()
    for t in loops:
        t.start()
    try:
        with srv.client(timeout_s=30) as c:
            answers = [c.infer("minilm", {"text": f"beside /debug {i}"}) for i in range(100)]
    finally:
        stop.set()
        for t in loops:
            t.join(15)
    elapsed = time.monotonic() - t0
    asked = sum(len(s) for s in seen)
    summaries = len({a for s in seen for a in s})
    print(f"{asked} /debug answers in {elapsed:.2f} s from {summaries} stage summaries")
    assert failed == []
    assert min(len(s) for s in seen) > 5, [len(s) for s in seen]  # every loop ran alongside the answers
    assert all(len(a["outputs"]["embedding"]) == 384 for a in answers)
    periods = elapsed / (SNAPSHOT_MS / 1000)
    assert asked > 4 * (periods + 2), (asked, periods)  # many more asks than periods: the rule is what bounds
    assert summaries <= periods + 2, (summaries, periods)


def test_half_open_connections_hold_no_threads_and_are_dropped_quietly(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_HTTP_THREADS="4", AIENG_HTTP_TIMEOUT_S="3").start()
    fe = psutil.Process(srv.health()["processes"]["frontend"]["pid"])
    threads_before = fe.num_threads()
    timeouts_before = dropped(srv.http, "timeout")
    idle = [socket.create_connection(("127.0.0.1", srv.http_port), timeout=5) for _ in range(300)]
    try:
        assert fe.num_threads() <= threads_before + 2, (threads_before, fe.num_threads())
        code, _, body = get(srv.http + "/healthz")
        assert code == 200 and json.loads(body)["live"] is True
        assert all(still_open(s) for s in idle)  # answered while all 300 were still open
        assert fe.num_threads() <= threads_before + 2, (threads_before, fe.num_threads())
        deadline = time.monotonic() + 15  # timeout_s plus the /metrics render period, with room
        now = dropped(srv.http, "timeout")
        while now - timeouts_before < 300 and time.monotonic() < deadline:
            time.sleep(0.2)
            now = dropped(srv.http, "timeout")
        assert now - timeouts_before == 300
        for s in idle:
            s.settimeout(5)
            assert s.recv(1) == b""  # closed by the server
    finally:
        for s in idle:
            s.close()
    assert srv.stop() == 0
    assert "Traceback" not in srv.output()


def test_token_guards_metrics_and_debug_but_not_probes(make_server, tmp_path):
    token_file = tmp_path / "http-token"
    token_file.write_text("  s3cret-token\n")
    srv = make_server(AIENG_MODELS="tabular", AIENG_HTTP_TOKEN_FILE=str(token_file)).start()
    for path in ("/metrics", "/debug"):
        code, headers, _ = get(srv.http + path)
        assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer"), (path, code, headers)
        assert get(srv.http + path, token="wrong")[0] == 401
        assert get(srv.http + path, token="s3cret-token")[0] == 200
    assert get(srv.http + "/healthz")[0] == 200
    assert get(srv.http + "/readyz")[0] == 200


def test_debug_works_with_curve_on(make_server, tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    server_pub, server_secret_file = zmq.auth.create_certificates(str(keys), "server")
    _, client_secret_file = zmq.auth.create_certificates(str(keys), "client")
    s_pub, _ = zmq.auth.load_certificate(server_pub)
    c_pub, c_sec = zmq.auth.load_certificate(client_secret_file)
    srv = make_server(AIENG_MODELS="tabular", AIENG_CURVE_SECRET_KEY_FILE=server_secret_file)
    srv.curve = (c_pub, c_sec, s_pub)
    srv.start()
    with Client(srv.addr, timeout_s=10, curve=(c_pub, c_sec, s_pub)) as c:
        for i in range(5):
            c.infer("tabular", {"island": "Dream", "bill_length_mm": 40 + i})
    deadline = time.monotonic() + 5  # /debug serves the loop's snapshot, published every 0.5 s
    code, _, body = get(srv.http + "/debug")
    while "tabular" not in json.loads(body)["stats"].get("models", {}) and time.monotonic() < deadline:
        time.sleep(0.1)
        code, _, body = get(srv.http + "/debug")
    debug = json.loads(body)
    assert code == 200 and "error" not in debug["stats"]
    assert debug["stats"]["models"]["tabular"]["requests"] == 5
    assert debug["stats"]["models"]["tabular"]["stages_us"]["inference"]["p50"] > 0
    assert debug["in_flight"] == 0 and debug["health"]["ready"] is True


def test_busy_http_port_fails_the_start_naming_the_address(make_server):
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        srv = make_server(AIENG_MODELS="tabular", AIENG_HTTP_ADDR=f"127.0.0.1:{port}").start(wait=False)
        code = srv.proc.wait(60)
    assert code != 0
    assert f"cannot bind the HTTP address 127.0.0.1:{port} (AIENG_HTTP_ADDR)" in srv.output()
    assert "Address already in use" in srv.output()
