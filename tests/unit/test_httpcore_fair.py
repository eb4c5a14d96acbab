"""Issue 33: the HTTP server shared fairly between peers (aieng/httpcore/fair.py and the connection cap of
aieng/httpcore/server.py), in-process on loopback: 127.0.0.2 is the peer holding the port, 127.0.0.1 the
newcomer."""
from __future__ import annotations

import asyncio
import logging

from aieng.httpcore import server as httpd
from aieng.httpcore.fair import FairPace, peer_key
from tests.unit.test_httpcore import echo, read_response, run


def test_peer_key_is_the_address_or_an_ipv6_slash_64():
    assert peer_key("127.0.0.2") == "127.0.0.2"
    assert peer_key("::ffff:10.1.2.3") == "10.1.2.3"  # a dual-stack socket's IPv4 client
    assert peer_key("2001:db8:1:2:aaaa::1") == peer_key("2001:db8:1:2:bbbb::7") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != peer_key("2001:db8:1:2::1")
    assert peer_key("fe80::1%eth0") == "fe80::/64"
    assert peer_key("/run/x.sock") == "/run/x.sock"


def test_pace_takes_peers_in_turn():
    async def go():
        pace, order = FairPace(rate=50.0), []
        assert pace.ticket("a") is None  # the free turn
        tickets = [("a", i, pace.ticket("a")) for i in range(4)] + [("b", 0, pace.ticket("b"))]

        async def wait(peer, i, fut):
            await fut
            order.append(f"{peer}{i}")
        await asyncio.gather(*(wait(*t) for t in tickets))
        pace.close()
        return order

    assert run(go()) == ["a0", "b0", "a1", "a2", "a3"]


async def serve(max_conns: int, rate: float = 0.0) -> tuple[httpd.HttpServer, int]:
    srv = httpd.HttpServer(echo, 1000, head_s=5.0, idle_s=5.0, max_conns=max_conns,
                           log=logging.getLogger("test"), rate=rate)
    await srv.start("127.0.0.1", 0)
    return srv, srv.server.sockets[0].getsockname()[1]


async def connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def until_held(srv: httpd.HttpServer, want: dict[str, int], phase: str) -> None:
    while dict(srv.held) != want or any(s.phase != phase for s in srv.conns.values()):
        await asyncio.sleep(0.01)


def test_at_the_cap_a_new_peer_takes_the_place_of_a_slow_head_of_the_peer_holding_most():
    async def go():
        srv, port = await serve(max_conns=4)
        heads = [await connect(port, "127.0.0.2") for _ in range(4)]
        for _, w in heads:
            w.write(b"GET /slow HTTP/1.1\r\nX-Slow: ")  # never finished
        await asyncio.wait_for(until_held(srv, {"127.0.0.2": 4}, "reading"), 5)
        reader, writer = await connect(port, "127.0.0.1")
        writer.write(b"GET /probe HTTP/1.1\r\n\r\n")
        answer = await read_response(reader)
        oldest = await asyncio.wait_for(heads[0][0].read(), 5)  # closed for the newcomer
        held = dict(srv.held)
        for _, w in heads + [(reader, writer)]:
            w.close()
        await srv.close(0.1)
        return answer, oldest, held, dict(srv.dropped)

    answer, oldest, held, dropped = run(go())
    assert answer == (200, b"GET /probe 0")
    assert oldest.startswith(b"HTTP/1.1 503 ") and b"busy" in oldest and b"Connection: close" in oldest
    assert held == {"127.0.0.2": 3, "127.0.0.1": 1}
    assert dropped["reading, closed for a new connection"] == 1


def test_one_peer_at_the_cap_with_only_slow_heads_is_refused_its_next_connection():
    async def go():
        srv, port = await serve(max_conns=2)
        heads = [await connect(port, "127.0.0.2") for _ in range(2)]
        for _, w in heads:
            w.write(b"GET /slow HTTP/1.1\r\nX-Slow: ")
        await asyncio.wait_for(until_held(srv, {"127.0.0.2": 2}, "reading"), 5)
        reader, writer = await connect(port, "127.0.0.2")
        refused = await asyncio.wait_for(reader.read(), 5)
        for _, w in heads + [(reader, writer)]:
            w.close()
        await srv.close(0.1)
        return refused, dict(srv.dropped)

    refused, dropped = run(go())
    assert refused == b"" and dropped["too many connections"] == 1  # its own heads are not closed for it


def test_a_request_waiting_its_turn_closed_for_a_new_peer_is_answered_503():
    async def go():
        srv, port = await serve(max_conns=3, rate=0.2)  # one turn per 5 s: nothing waiting is served here
        first_r, first_w = await connect(port, "127.0.0.2")
        first_w.write(b"GET /first HTTP/1.1\r\nConnection: close\r\n\r\n")
        first = await read_response(first_r)  # the free turn
        waiting = [await connect(port, "127.0.0.2") for _ in range(3)]
        for _, w in waiting:
            w.write(b"POST /flood HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        await asyncio.wait_for(until_held(srv, {"127.0.0.2": 3}, "waiting"), 5)
        reader, writer = await connect(port, "127.0.0.1")
        writer.write(b"GET /probe HTTP/1.1\r\n\r\n")
        bumped = await read_response(waiting[0][0])
        closed = await asyncio.wait_for(waiting[0][0].read(), 5)
        await asyncio.wait_for(until_held(srv, {"127.0.0.2": 2, "127.0.0.1": 1}, "waiting"), 5)
        for _, w in waiting + [(reader, writer), (first_r, first_w)]:
            w.close()
        held = srv.body_bytes  # the two still waiting
        await srv.close(0.1)
        return first, bumped, closed, dict(srv.dropped), held, srv.body_bytes

    first, bumped, closed, dropped, held, left = run(go())
    assert held == 10 and left == 0  # bodies of requests cut while waiting are given back
    assert first == (200, b"GET /first 0")
    assert bumped[0] == 503 and b"busy" in bumped[1] and closed == b""
    assert dropped["waiting, closed for a new connection"] == 1
