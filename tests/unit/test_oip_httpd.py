"""The gateway's HTTP/1.1 server (aieng/gateway/httpd.py) in-process: keep-alive, pipelined requests in
order, HEAD, the body memory budget and the connection cap, each refusal closing only its connection."""
from __future__ import annotations

import asyncio
import logging

import pytest

from aieng.gateway import httpd


async def echo(method, path, query, headers, body):
    return 200, {"Content-Type": "text/plain"}, f"{method} {path} {len(body)}".encode()


async def start(max_body: int = 1000, max_conns: int = 64) -> tuple[httpd.HttpServer, int]:
    srv = httpd.HttpServer(echo, max_body, head_s=5.0, idle_s=5.0, max_conns=max_conns,
                           log=logging.getLogger("test"))
    await srv.start("127.0.0.1", 0)
    return srv, srv.server.sockets[0].getsockname()[1]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.split(b"\r\n")
    n = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    return int(head.split(b" ")[1]), await reader.readexactly(n)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_keep_alive_pipelined_in_order_and_head():
    async def go():
        srv, port = await start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\n\r\n"
                     b"HEAD /c HTTP/1.1\r\n\r\n")
        first, second = await read_response(reader), await read_response(reader)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        await srv.close(1)
        return first, second, head

    first, second, head = run(go())
    assert first == (200, b"POST /a 3") and second == (200, b"GET /b 0")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 9" in head  # "HEAD /c 0", not sent


def test_bodies_over_the_memory_budget_are_503():
    async def go():
        srv, port = await start(max_body=1000)
        held = []
        for _ in range(httpd.BODY_BUDGET):  # each announces a full-size body and sends none of it yet
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /x HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
            await writer.drain()
            held.append((reader, writer))
        while srv.body_bytes < httpd.BODY_BUDGET * 1000:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789")
        refused = await read_response(reader)
        held[0][1].write(b"x" * 1000)  # a held one completes normally
        served = await read_response(held[0][0])
        for _, w in held + [(reader, writer)]:
            w.close()
        await srv.close(1)
        return refused, served, dict(srv.dropped)

    refused, served, dropped = run(go())
    assert refused[0] == 503 and served == (200, b"POST /x 1000")
    assert dropped["bodies over the memory budget"] == 1


def test_connections_over_the_cap_are_closed_at_once():
    async def go():
        srv, port = await start(max_conns=2)
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        while len(srv.conns) < 2:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        extra = await asyncio.wait_for(reader.read(), 5)
        conns[0][1].write(b"GET /ok HTTP/1.1\r\n\r\n")
        ok = await read_response(conns[0][0])
        for _, w in conns + [(reader, writer)]:
            w.close()
        await srv.close(1)
        return extra, ok

    extra, ok = run(go())
    assert extra == b"" and ok == (200, b"GET /ok 0")


@pytest.mark.parametrize("head, status", [
    (b"BROKEN\r\n\r\n", 400), (b"GET /x HTTP/2.0\r\n\r\n", 505),
    (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
    (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST /x HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400),  # latin-1 "²": isdigit() is True
    (b"POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413)])
def test_bad_heads(head, status):
    async def go():
        srv, port = await start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        got = await read_response(reader)
        writer.close()
        await srv.close(1)
        return got

    assert run(go())[0] == status
