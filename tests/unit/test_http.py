"""The probe port's pure parts (auth, the /metrics render cache, address errors) and the port itself on a
loopback socket, on aieng.httpcore (deadlines, overflow, counted drops, the answer rate), without any aieng
process."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from aieng.frontend.observe import http
from aieng.frontend.observe.http import HttpServer, authorized, bind, parse_addr, read_token
from tests.conftest import free_port
from tests.waits import until


def http_get(port: int, path: str, headers: dict[str, str] | None = None,
             method: str = "GET") -> tuple[int, dict, bytes]:
    return exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                    + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode() + b"\r\n")


def exchange(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send ``request`` and read until the server closes: (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), hdrs, body


def test_bearer_auth():
    assert authorized(None, None)  # no token configured: open
    assert authorized("Bearer s3cret", b"s3cret")
    assert authorized("bearer s3cret", b"s3cret")
    assert not authorized(None, b"s3cret")
    assert not authorized("Bearer wrong", b"s3cret")
    assert not authorized("Basic s3cret", b"s3cret")
    assert not authorized("Bearer", b"s3cret")


def test_read_token(tmp_path):
    f = tmp_path / "token"
    f.write_text("  s3cret\n")
    assert read_token(str(f)) == b"s3cret"
    f.write_text(" \n")
    with pytest.raises(ValueError, match=str(f)):
        read_token(str(f))


def test_address_errors_name_the_address():
    with pytest.raises(ValueError, match="nonsense"):
        parse_addr("nonsense")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        named = rf"cannot bind the HTTP address 127\.0\.0\.1:{port} \(AIENG_HTTP_ADDR\): \[Errno 98\]"
        with pytest.raises(OSError, match=named):
            bind(f"127.0.0.1:{port}")


@pytest.fixture
def make_http():
    made: list[HttpServer] = []

    def make(**kw) -> tuple[HttpServer, int]:
        port = free_port()
        kw.setdefault("snapshot", lambda: {
            "published_at": time.monotonic(), "supervisor_seen_at": time.monotonic(),
            "health": {"live": True, "ready": False, "started": True}})
        kw.setdefault("metrics", lambda: b"m 1\n")
        srv = HttpServer(f"127.0.0.1:{port}", **kw)
        made.append(srv)
        return srv, port

    yield make
    for srv in made:
        srv.close()


def test_routes_and_token(make_http, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    srv, port = make_http(token_file=str(token))
    assert http_get(port, "/healthz")[0] == 200
    assert http_get(port, "/readyz")[0] == 503  # ready False in the snapshot
    assert http_get(port, "/startupz")[0] == 200  # started once
    for path in ("/metrics", "/debug"):
        code, headers, _ = http_get(port, path)
        assert code == 401 and headers["www-authenticate"].startswith("Bearer")
        assert http_get(port, path, {"Authorization": "Bearer nope"})[0] == 401
        assert http_get(port, path, {"Authorization": "Bearer s3cret"})[0] == 200
    assert http_get(port, "/nope")[0] == 404


def test_answers_headers_head_and_refusals(make_http):
    srv, port = make_http()
    code, headers, body = http_get(port, "/healthz")
    assert code == 200 and headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store" and headers["connection"] == "close" and "date" in headers
    assert int(headers["content-length"]) == len(body) > 0
    code, headers, body = http_get(port, "/healthz", method="HEAD")
    assert code == 200 and body == b"" and int(headers["content-length"]) > 0
    code, headers, _ = http_get(port, "/healthz", method="POST")
    assert code == 405 and headers["allow"] == "GET, HEAD"
    assert exchange(port, b"GET /\r\n\r\n")[0] == 505  # HTTP/0.9
    assert exchange(port, b"GET / SPDY/3\r\n\r\n")[0] == 400
    assert exchange(port, b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")[0] == 400


def test_keep_alive_answers_in_order(make_http):
    srv, port = make_http()
    req = b"GET /readyz HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"
    code, headers, rest = exchange(port, req)
    assert code == 503 and "connection" not in headers  # kept open for the next one
    n = int(headers["content-length"])
    assert rest[n:].startswith(b"HTTP/1.1 200 OK\r\n")


def test_over_the_rate_requests_wait_their_turn_taking_turns_between_addresses(make_http, monkeypatch):
    """Issue 33: four requests from 127.0.0.2 over the rate wait in line; one from 127.0.0.1 that comes
    after them is answered after the first of them, not after all four."""
    monkeypatch.setattr(http, "MAX_RATE", 4.0)
    srv, port = make_http()
    order: list[str] = []
    lock = threading.Lock()

    def ask(name: str, source: str) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        with lock:
            order.append(f"{name} {int(data.split()[1])}")

    assert http_get(port, "/readyz")[0] == 503  # takes the turn that is free now: every other one waits
    flood = [threading.Thread(target=ask, args=(f"flood{i}", "127.0.0.2")) for i in range(4)]
    for t in flood:
        t.start()
    assert until(lambda: srv.core.pace.waiting >= 3, 5), srv.core.pace.waiting
    probe = threading.Thread(target=ask, args=("probe", "127.0.0.1"))
    probe.start()
    for t in flood + [probe]:
        t.join(15)
    assert order.index("probe 200") <= 2, order  # behind at most the one or two flood requests due first
    assert sorted(order) == ["flood0 200", "flood1 200", "flood2 200", "flood3 200", "probe 200"]


def test_metrics_render_at_most_once_per_period(make_http):
    renders = []

    def render() -> bytes:
        renders.append(time.monotonic())
        time.sleep(0.05)  # slow enough that concurrent scrapers overlap it
        return b"m %d\n" % len(renders)

    srv, port = make_http(metrics=render, cache_ms=60_000)
    bodies: list[bytes] = []

    def scrape() -> None:
        bodies.append(http_get(port, "/metrics")[2])

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(renders) == 1 and bodies == [b"m 1\n"] * 8  # eight scrapers, one render

    renders.clear()
    srv, port = make_http(metrics=render, cache_ms=100)
    assert http_get(port, "/metrics")[2] == b"m 1\n"
    time.sleep(0.15)  # past the period: the next scrape renders again
    assert http_get(port, "/metrics")[2] == b"m 2\n"


def test_debug_is_encoded_once_per_snapshot(make_http):
    snap = {"health": {"live": True}, "n": 1}
    srv, port = make_http(snapshot=lambda: snap)
    first = srv.debug_json(snap)
    assert srv.debug_json(snap) is first
    snap = {"health": {"live": True}, "n": 2}  # the loop swaps in a new dict
    assert http_get(port, "/debug")[2] == b'{"health": {"live": true}, "n": 2}'


def test_half_open_connections_cost_no_thread_and_are_dropped_on_time(make_http):
    drops: list[str] = []
    before = threading.active_count()
    srv, port = make_http(threads=2, timeout_s=0.5, dropped=drops.append)
    assert threading.active_count() == before + 1  # one thread, whatever ``threads`` says
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    try:
        assert http_get(port, "/healthz")[0] == 200  # answered at once, ahead of the silent ones
        assert threading.active_count() == before + 1
        deadline = time.monotonic() + 5
        while len(drops) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drops == ["timeout"] * 50
        assert all(s.recv(1) == b"" for s in idle)  # the server closed them
    finally:
        for s in idle:
            s.close()
    socket.create_connection(("127.0.0.1", port)).close()  # connects and leaves: a reset
    deadline = time.monotonic() + 5
    while len(drops) < 51 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert drops[50:] == ["reset"]


def test_at_the_connection_cap_the_oldest_idle_one_is_closed_for_a_new_one(make_http, monkeypatch):
    monkeypatch.setattr(http, "MAX_CONNS", 3)
    drops: list[str] = []
    srv, port = make_http(threads=1, timeout_s=5.0, dropped=drops.append)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        deadline = time.monotonic() + 5
        while len(srv.core.conns) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(srv.core.conns) == 3
        assert http_get(port, "/healthz")[0] == 200  # a probe is not locked out by silent connections
        assert idle[0].recv(1) == b""  # closed at once for it, not after timeout_s
        assert drops == ["overflow"]
    finally:
        for s in idle:
            s.close()


def test_liveness_is_the_loop_and_the_supervisor_making_progress():
    from aieng.frontend.observe.http import liveness

    now = 1000.0
    fresh = {"published_at": now - 0.4, "supervisor_seen_at": now - 0.9}
    assert liveness(fresh, now, 5.0)["alive"] is True
    assert liveness(dict(fresh, published_at=now - 6), now, 5.0)["alive"] is False  # a wedged loop
    assert liveness(dict(fresh, supervisor_seen_at=now - 6), now, 5.0)["alive"] is False  # supervisor gone
    assert liveness({}, now, 5.0)["alive"] is False  # nothing published yet
