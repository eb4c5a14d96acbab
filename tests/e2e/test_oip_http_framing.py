"""HTTP framing on the OIP port as real clients use it (issue 21), against the real server.

curl streaming a body (``-T -``) sends it chunked, as Go and Java clients and many proxies do: it must be
read, not refused with 411.  Transfer-Encoding beside Content-Length is refused (400: a proxy and this
server could frame the body differently, request smuggling); a coding other than chunked is 501.  Every
answer carries ``Date``; an HTTP/1.0 client that asks for keep-alive keeps its connection and is told so.
The frontend's probe port runs on the same server and frames the same way.
"""
from __future__ import annotations

import json
import socket
import subprocess
import time
from email.utils import parsedate_to_datetime

import pytest

BODY = json.dumps({"id": "c1", "inputs": [{"name": "bill_length_mm", "datatype": "FP32", "shape": [1],
                                           "data": [40.0]}]}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.conftest import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("framing"), AIENG_MODELS="tabular").start()
    yield srv
    srv.stop()


def exchange(addr: str, data: bytes, answers: int = 1) -> list[tuple[bytes, dict, bytes]]:
    """Send ``data`` on one connection and read ``answers`` answers: (status line, headers, body)."""
    host, port = addr.rsplit(":", 1)
    out, buf = [], b""
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        while len(out) < answers:
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                assert chunk, f"closed after {len(out)} answers"
                buf += chunk
            head, buf = buf.split(b"\r\n\r\n", 1)
            status, *lines = head.decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
            n = int(headers["content-length"])
            while len(buf) < n:
                chunk = s.recv(65536)
                assert chunk
                buf += chunk
            out.append((status.encode(), headers, buf[:n]))
            buf = buf[n:]
    return out


def test_curl_streaming_a_chunked_body_is_answered(server):
    out = subprocess.run(["curl", "-sS", "-T", "-", "-X", "POST", "-H", "Content-Type: application/json",
                          "-w", "\n%{http_code}", f"http://{server.oip_http}/v2/models/tabular/infer"],
                         input=BODY, capture_output=True, timeout=30)
    body, _, code = out.stdout.rpartition(b"\n")
    assert code == b"200", out.stdout + out.stderr
    answer = json.loads(body)
    assert answer["id"] == "c1" and answer["outputs"][0]["name"] == "label"


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def test_a_chunked_body_in_many_chunks_and_a_pipelined_request_after_it(server):
    req = (b"POST /v2/models/tabular/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
           + chunked(BODY) + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
    (s1, _, b1), (s2, _, b2) = exchange(server.oip_http, req, answers=2)
    assert s1.startswith(b"HTTP/1.1 200 ") and json.loads(b1)["id"] == "c1"
    assert s2.startswith(b"HTTP/1.1 200 ") and b2 == b""


@pytest.mark.parametrize("framing, status", [
    (b"Transfer-Encoding: chunked\r\nContent-Length: 5", b"400"),  # smuggling: which framing wins?
    (b"Content-Length: 5\r\nTransfer-Encoding: chunked", b"400"),
    (b"Transfer-Encoding: gzip", b"501"),
    (b"Transfer-Encoding: gzip, chunked", b"501")])
def test_ambiguous_or_unknown_framing_is_refused(server, framing, status):
    req = b"POST /v2/models/tabular/infer HTTP/1.1\r\nHost: t\r\n" + framing + b"\r\n\r\n0\r\n\r\n"
    [(line, headers, _)] = exchange(server.oip_http, req)
    assert line.split(b" ")[1] == status
    assert headers["connection"] == "close"


def test_every_answer_carries_date_and_http10_keep_alive_is_honoured(server):
    req = (b"POST /v2/models/tabular/infer HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: "
           + str(len(BODY)).encode() + b"\r\n\r\n" + BODY + b"GET /v2 HTTP/1.0\r\n\r\n")
    (s1, h1, b1), (s2, h2, _) = exchange(server.oip_http, req, answers=2)
    assert s1.startswith(b"HTTP/1.1 200 ") and json.loads(b1)["id"] == "c1"
    assert h1["connection"] == "keep-alive"  # asked for, kept, and said
    assert s2.startswith(b"HTTP/1.1 200 ") and h2["connection"] == "close"  # HTTP/1.0 without asking: closed
    for h in (h1, h2):
        assert abs(parsedate_to_datetime(h["date"]).timestamp() - time.time()) < 120


def test_the_probe_port_frames_as_the_oip_port(server):
    """The frontend's probe port runs on the same HTTP server: the same framing refusals, Date, keep-alive."""
    probe = f"127.0.0.1:{server.http_port}"
    for framing, status in ((b"Transfer-Encoding: chunked\r\nContent-Length: 5", b"400"),
                            (b"Transfer-Encoding: gzip", b"501")):
        [(line, headers, _)] = exchange(probe, b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + framing
                                        + b"\r\n\r\n0\r\n\r\n")
        assert line.split(b" ")[1] == status and headers["connection"] == "close"
    [(line, _, _)] = exchange(probe, b"GET /healthz HTTP/2.0\r\n\r\n")
    assert line.split(b" ")[1] == b"505"
    two = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /readyz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    (s1, h1, b1), (s2, h2, b2) = exchange(probe, two, answers=2)
    assert s1.startswith(b"HTTP/1.1 200 ") and json.loads(b1)["live"] is True and "connection" not in h1
    assert s2.startswith(b"HTTP/1.1 200 ") and json.loads(b2)["ready"] is True
    assert h2["connection"] == "keep-alive"
    for h in (h1, h2):
        assert abs(parsedate_to_datetime(h["date"]).timestamp() - time.time()) < 120
