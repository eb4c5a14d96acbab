"""The HTTP side's pure parts (request parsing, auth, the /metrics render cache, address errors) and the
bounded server on a loopback socket (deadlines, overflow, counted drops), without any aieng process."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from aieng.frontend.observe import httpserver
from aieng.frontend.observe.http import HttpServer, authorized, bind, parse_addr, read_token, response
from aieng.frontend.observe.httpserver import HeadError, parse_head
from tests.conftest import free_port


def http_get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), hdrs, body


def test_parse_head():
    head = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization:  Bearer t \r\n\r\n"
    method, path, headers = parse_head(head)
    assert (method, path) == ("GET", "/metrics")
    assert headers == {"host": "a", "authorization": "Bearer t"}
    assert parse_head(b"HEAD /debug HTTP/1.0\n\n")[:2] == ("HEAD", "/debug")
    for bad in (b"GET /\r\n\r\n", b"GET / SPDY/3\r\n\r\n", b"GET / HTTP/1.1\r\nno colon here\r\n\r\n"):
        with pytest.raises(HeadError) as e:
            parse_head(bad)
        assert e.value.code == 400


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


def test_response_bytes():
    data = response(401, b"{}", extra={"WWW-Authenticate": 'Bearer realm="aieng"'})
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and body == b"{}"
    assert b"Content-Length: 2" in head and b"Connection: close" in head
    assert b"WWW-Authenticate: Bearer" in head
    assert response(200, b"abc", head_only=True).endswith(b"\r\n\r\n")


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
    assert threading.active_count() == before + 3  # one reader, two workers
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    try:
        assert http_get(port, "/healthz")[0] == 200  # answered at once, ahead of the silent ones
        assert threading.active_count() == before + 3
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


def test_full_backlog_closes_new_connections_at_once(make_http, monkeypatch):
    monkeypatch.setattr(httpserver, "MAX_PENDING", 3)
    drops: list[str] = []
    srv, port = make_http(threads=1, timeout_s=5.0, dropped=drops.append)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        deadline = time.monotonic() + 5
        while len(srv.server.pending) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert extra.recv(1) == b""  # closed at once, not after timeout_s
        extra.close()
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
