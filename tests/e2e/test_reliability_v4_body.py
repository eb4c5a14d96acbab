"""Reliability v4 (issue 33): a request body costs the gateway memory in proportion to the body, however it
is framed.  A body of 1-byte chunks (chunked transfer coding, six bytes on the wire per body byte) used to
cost a Python object per byte, 45 bytes of memory per body byte."""
from __future__ import annotations

import socket
import threading

import psutil
import pytest

pytestmark = pytest.mark.e2e

BODY = 4 << 20  # body bytes, each in a chunk of its own


def send_one_byte_chunks(addr: str, n: int) -> int:
    """POST a body of ``n`` 1-byte chunks to a path that is not served (404: the body is read whole first,
    and nothing parses it); the status."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v2/nowhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Connection: close\r\n\r\n")
        piece = b"1\r\nx\r\n" * (1 << 16)
        for _ in range(n >> 16):
            s.sendall(piece)
        s.sendall(b"0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_a_body_of_one_byte_chunks_costs_memory_in_proportion_to_the_body(make_server):
    # a timeout with room: the gateway parses 4 Mi chunks at a few microseconds each on a busy machine
    srv = make_server(AIENG_MODELS="tabular", AIENG_HTTP_TIMEOUT_S="60").start()
    gateway = psutil.Process(srv.child_pid("aieng::gateway"))
    before = gateway.memory_info().rss
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], gateway.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        status = send_one_byte_chunks(srv.oip_http, BODY)
    finally:
        done.set()
        sampler.join(5)
    grown = peak[0] - before
    print(f"gateway RSS {before >> 20} MiB, at most {peak[0] >> 20} MiB: {grown / BODY:.1f} x the body")
    assert status == 404
    assert grown < 3 * BODY, (before, peak[0])
