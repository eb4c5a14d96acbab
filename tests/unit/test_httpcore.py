"""The HTTP/1.1 server both ports run on (aieng/httpcore) in-process: keep-alive, pipelined requests in
order, HEAD, the body memory budget and the connection cap, each refusal closing only its connection."""
from __future__ import annotations

import asyncio
import logging

import pytest

from aieng.httpcore import message
from aieng.httpcore import server as httpd
from tests.waits import until_async


async def echo(method, path, query, headers, body, peer):
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
    return int(head.split(b" ")[1]), await asyncio.wait_for(reader.readexactly(n), 5)


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


def test_announced_bodies_hold_no_budget_received_bytes_do():
    """Issue 20, finding 1: a head announcing a full-size body and sending none of it holds nothing; bytes
    that arrived and are not answered yet count, so the next body that does not fit is 503."""
    async def go():
        srv, port = await start(max_body=1000)
        announced = []
        for _ in range(message.BODY_BUDGET + 2):  # more announcers than the budget has room for
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /x HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
            await writer.drain()
            announced.append((reader, writer))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789")
        served_beside_announcers = await read_response(reader)
        for _, w in announced[:message.BODY_BUDGET]:  # now they send most of their bodies: those bytes held
            w.write(b"x" * 999)
            await w.drain()
        assert await until_async(lambda: srv.body_bytes >= message.BODY_BUDGET * 999, 10), srv.body_bytes
        writer.write(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789")
        refused = await read_response(reader)
        announced[0][1].write(b"x")  # a held one completes normally
        completed = await read_response(announced[0][0])
        for _, w in announced + [(reader, writer)]:
            w.close()
        await srv.close(1)
        return served_beside_announcers, refused, completed, dict(srv.dropped)

    served, refused, completed, dropped = run(go())
    assert served == (200, b"POST /x 10")
    assert refused[0] == 503 and completed == (200, b"POST /x 1000")
    assert dropped["bodies over the memory budget"] == 1


def test_at_the_cap_a_new_connection_closes_the_oldest_idle_one():
    """Issue 20, finding 2: idle connections cannot lock everyone else out."""
    async def go():
        srv, port = await start(max_conns=2)
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        assert await until_async(lambda: len(srv.conns) >= 2, 10), len(srv.conns)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /new HTTP/1.1\r\n\r\n")
        new = await read_response(reader)
        oldest_closed = await asyncio.wait_for(conns[0][0].read(), 5)  # EOF: it was the idle one closed
        conns[1][1].write(b"GET /kept HTTP/1.1\r\n\r\n")
        kept = await read_response(conns[1][0])
        for _, w in conns + [(reader, writer)]:
            w.close()
        await srv.close(1)
        return new, oldest_closed, kept, dict(srv.dropped)

    new, oldest_closed, kept, dropped = run(go())
    assert new == (200, b"GET /new 0") and oldest_closed == b"" and kept == (200, b"GET /kept 0")
    assert dropped["idle, closed for a new connection"] == 1


def test_at_the_cap_with_every_connection_busy_a_new_one_is_closed_at_once():
    gate = asyncio.Event()

    async def slow(method, path, query, headers, body, peer):
        await gate.wait()
        return 200, {}, b"done"

    async def go():
        srv = httpd.HttpServer(slow, 1000, head_s=5.0, idle_s=5.0, max_conns=1, log=logging.getLogger("test"))
        await srv.start("127.0.0.1", 0)
        port = srv.server.sockets[0].getsockname()[1]
        busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
        busy_w.write(b"GET /busy HTTP/1.1\r\n\r\n")
        assert await until_async(lambda: any(s.phase == "answering" for s in srv.conns.values()), 10)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        extra = await asyncio.wait_for(reader.read(), 5)
        gate.set()
        done = await read_response(busy_r)
        for w in (busy_w, writer):
            w.close()
        await srv.close(1)
        return extra, done, dict(srv.dropped)

    extra, done, dropped = run(go())
    assert extra == b"" and done == (200, b"done") and dropped["too many connections"] == 1


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


def test_a_head_under_the_limit_sent_in_pieces_is_served_and_one_over_it_is_431():
    async def go():
        srv, port = await start()
        got = []
        for size in (40_000, message.HEAD_BYTES + 10):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = b"GET /h HTTP/1.1\r\nX: " + b"a" * size + b"\r\n\r\n"
            for i in range(0, len(head), 9_000):  # the parser sees the head in several pieces
                writer.write(head[i:i + 9_000])
                await writer.drain()
                await asyncio.sleep(0.01)
            got.append((await read_response(reader))[0])
            writer.close()
        await srv.close(1)
        return got

    assert run(go()) == [200, 431]


def test_a_client_that_does_not_read_its_answer_is_cut_and_counted(monkeypatch):
    monkeypatch.setattr(httpd, "MIN_RATE", 1 << 30)  # the answer's allowance: head_s plus a few ms
    kinds: list[str] = []

    async def big(method, path, query, headers, body, peer):
        return 200, {}, b"x" * (64 << 20)  # more than the socket buffers hold

    async def go():
        srv = httpd.HttpServer(big, 1000, head_s=0.3, idle_s=5.0, max_conns=4, log=logging.getLogger("test"),
                               on_drop=kinds.append)
        await srv.start("127.0.0.1", 0)
        port = srv.server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /big HTTP/1.1\r\n\r\n")  # and never reads
        assert await until_async(lambda: srv.dropped, 10, 0.05)
        gone = not srv.conns
        writer.close()
        await srv.close(1)
        return dict(srv.dropped), gone

    dropped, gone = run(go())
    assert dropped == {"answer not read in time": 1} and kinds == ["timeout"] and gone


def test_on_drop_counts_connections_that_ended_without_an_answer():
    kinds: list[str] = []

    async def go():
        srv = httpd.HttpServer(echo, 1000, head_s=0.3, idle_s=0.3, max_conns=4, log=logging.getLogger("test"),
                               on_drop=kinds.append)
        await srv.start("127.0.0.1", 0)
        port = srv.server.sockets[0].getsockname()[1]
        _, silent = await asyncio.open_connection("127.0.0.1", port)  # says nothing: timeout
        _, leaves = await asyncio.open_connection("127.0.0.1", port)
        leaves.close()  # connects and leaves: reset
        reader, served = await asyncio.open_connection("127.0.0.1", port)
        served.write(b"GET /a HTTP/1.1\r\n\r\n")
        answer = await read_response(reader)  # then idles past idle_s: closed, not counted
        assert await until_async(lambda: len(srv.dropped) >= 2 and not srv.conns, 10, 0.05), dict(srv.dropped)
        for w in (silent, served):
            w.close()
        await srv.close(1)
        return answer, dict(srv.dropped)

    answer, dropped = run(go())
    assert answer == (200, b"GET /a 0")
    assert sorted(kinds) == ["reset", "timeout"]
    assert dropped == {"closed by the client": 1, "idle": 2}
