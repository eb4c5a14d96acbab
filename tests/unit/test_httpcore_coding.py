"""Content codings on the HTTP core (aieng/httpcore/coding.py), as Triton's clients send them: gzip and
deflate request bodies inflated within the body limit (a zip bomb stops at the limit, a corrupt stream is
400), the coding an answer may go in (the handler's to apply), and a server without codings unchanged."""
from __future__ import annotations

import asyncio
import gzip
import logging
import zlib

import pytest

from aieng.httpcore import coding
from aieng.httpcore import server as httpd
from aieng.httpcore.message import HttpError
from tests.unit.test_httpcore import run

LIMIT = 100_000


async def echo(method, path, query, headers, body, peer):
    """The body back, with the coding headers the handler saw."""
    seen = f"{headers.get('content-encoding', '-')}|{len(body)}|".encode()
    return 200, {"Content-Type": "application/octet-stream"}, seen + body


async def exchange(raw: bytes, codings: bool = True) -> tuple[int, dict, bytes]:
    srv = httpd.HttpServer(echo, LIMIT, head_s=5.0, idle_s=5.0, max_conns=8, log=logging.getLogger("t"),
                           codings=codings)
    await srv.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.sockets[0].getsockname()[1])
    writer.write(raw)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    writer.close()
    await srv.close(1)
    return int(lines[0].split(" ")[1]), headers, body


def post(body: bytes, *extra: str) -> bytes:
    head = "\r\n".join(("POST /x HTTP/1.1", f"Content-Length: {len(body)}", *extra))
    return head.encode() + b"\r\n\r\n" + body


PAYLOAD = b"0123456789abcdef" * 1000


@pytest.mark.parametrize("name,packed", [("gzip", gzip.compress(PAYLOAD, mtime=0)),
                                         ("deflate", zlib.compress(PAYLOAD))])
def test_request_bodies_are_inflated_for_the_handler(name, packed):
    status, headers, body = run(exchange(post(packed, f"Content-Encoding: {name}")))
    assert status == 200 and "content-encoding" not in headers
    assert body == f"-|{len(PAYLOAD)}|".encode() + PAYLOAD  # the handler saw no coding, the whole body


@pytest.mark.parametrize("accept,name", [("gzip", "gzip"), ("deflate", "deflate"), ("deflate, gzip", "gzip"),
                                         ("gzip;q=0.2, deflate;q=0.9", "deflate"), ("x-gzip", "gzip"),
                                         ("identity", None), ("gzip;q=0", None), ("br, *", None), ("", None)])
def test_the_answer_coding_a_client_accepts(accept, name):
    assert coding.response_coding({"accept-encoding": accept} if accept else {}) == name


@pytest.mark.parametrize("name,decompress", [("gzip", gzip.decompress), ("deflate", zlib.decompress)])
def test_an_answer_compressed_as_accepted_decompresses_to_itself(name, decompress):
    assert decompress(coding.compress(PAYLOAD, name)) == PAYLOAD


def test_the_server_never_compresses_an_answer_itself():
    """Which answers a client reads compressed is the handler's to say (tritonclient's aio client asks
    for gzip on every call and decompresses infer answers only)."""
    status, headers, body = run(exchange(post(PAYLOAD, "Accept-Encoding: gzip")))
    assert status == 200 and "content-encoding" not in headers and body.endswith(PAYLOAD)


def test_a_zip_bomb_stops_at_the_body_limit():
    bomb = gzip.compress(b"\0" * (50 * LIMIT))  # 5 MB of zeros in ~5 KB
    assert len(bomb) < LIMIT
    status, _, body = run(exchange(post(bomb, "Content-Encoding: gzip")))
    assert status == 413 and str(LIMIT).encode() in body


def test_inflate_never_holds_more_than_the_limit_and_a_slice():
    with pytest.raises(HttpError) as err:
        coding.inflate(zlib.compress(b"\0" * (1 << 26)), "deflate", 1 << 20)
    assert err.value.status == 413
    assert coding.inflate(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 10) == b"abcd"  # members
    assert coding.inflate(zlib.compress(b"x" * LIMIT), "deflate", LIMIT) == b"x" * LIMIT  # exactly the limit


@pytest.mark.parametrize("name,packed", [
    ("gzip", b"not gzip at all"),
    ("gzip", gzip.compress(PAYLOAD, mtime=0)[:-20]),  # truncated
    ("deflate", zlib.compress(PAYLOAD) + b"tail"),  # bytes after the stream
    ("deflate", b""),
])
def test_a_corrupt_stream_is_400(name, packed):
    status, _, body = run(exchange(post(packed, f"Content-Encoding: {name}")))
    assert status == 400 and name.encode() in body, body


def test_an_unknown_coding_is_415():
    status, _, body = run(exchange(post(PAYLOAD, "Content-Encoding: br")))
    assert status == 415 and b"br" in body


def test_a_server_without_codings_passes_bodies_as_they_came():
    packed = gzip.compress(PAYLOAD, mtime=0)
    status, headers, body = run(exchange(post(packed, "Content-Encoding: gzip", "Accept-Encoding: gzip"),
                                         codings=False))
    assert status == 200 and "content-encoding" not in headers
    assert body == f"gzip|{len(packed)}|".encode() + packed


def test_a_big_body_is_inflated_off_the_loop():
    big = bytes(range(256)) * 300  # 76.8 KB, compresses poorly: work past OFF_LOOP_BYTES
    packed = gzip.compress(big)
    assert len(packed) * coding.MAX_RATIO > coding.OFF_LOOP_BYTES
    status, _, body = run(exchange(post(packed, "Content-Encoding: gzip")))
    assert status == 200 and body == f"-|{len(big)}|".encode() + big
