"""The one HTTP/1.1 server of aieng (the OIP REST port, the frontend's probe port), on asyncio.
``message.Reader`` (llhttp) parses and checks requests; this module holds the connections, each a file
descriptor and a coroutine, never a thread, and every way of holding one is bounded:

    idle         no request started: closed after ``idle_s``
    head, body   a head within ``head_s`` of its first byte, a body at ``MIN_RATE`` or better (else 408)
    answers      one at a time per connection, in order (pipelined requests wait), each with ``Date``;
                 HTTP/1.0 keeps the connection only when asked; an answer must be read at ``MIN_RATE``
    connections  at most ``max_conns``, shared fairly between peers (``fair.peer_key``): at the cap a
                 new connection from peer P takes the place of one held by the peer holding the most, when
                 that peer holds at least two more than P (its oldest idle connection, else its oldest one
                 still sending a request, else its oldest one waiting for its turn; a request started on
                 it is answered 503 "busy" first); otherwise of the oldest idle connection of a peer
                 holding at least as many as P; a connection being answered is never closed for another;
                 when there is none to close, the new one is closed at once.  So one peer can hold every
                 connection while nobody else wants one, and never keep another peer out
    codings      with ``codings`` on, gzip and deflate request bodies (``coding.py``): the handler sees
                 the inflated body (bounded by ``max_body``, counted in the body budget); which answers
                 are compressed is the handler's to say
    rate         with ``rate`` set, at most that many answers a second, the waiting requests of every
                 peer taking turns (``fair.FairPace``): a flood from one peer delays another's request
                 by about one turn per peer waiting, not by the flood
    tls          with ``tls`` (an ``ssl.SSLContext``, ``tls.py``), every connection is TLS, its handshake
                 within ``head_s``; a connection counts from its completed handshake, and its ``Peer.subject``
                 names a verified client certificate (mutual TLS); without, nothing of it runs

Every close the client did not ask for is a DEBUG line and a count in ``dropped`` (by detail); one that
ended without an answer also calls ``on_drop(kind)``, kind in ``KINDS``.  The handler gets ``(method,
path, query, headers, body, peer)`` (``Peer``: both ends of the connection, and the client certificate's
subject under mutual TLS) and returns ``(status, headers, body)``; an exception is a 500.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass
from email.utils import formatdate
from typing import Awaitable, Callable

import httptools

from aieng.httpcore.coding import Codings
from aieng.httpcore.fair import Bumped, FairPace, peer_key
from aieng.httpcore.message import (
    BODY_BUDGET,
    BODY_CHUNK,
    HEAD_BYTES,
    MIN_RATE,
    REASONS,
    BodyBudget,
    HttpError,
    Reader,
    Request,
    error_response,
    parser_error,
)
from aieng.httpcore.tls import subject_text

Handler = Callable[[str, str, str, dict, bytes, "Peer"], Awaitable[tuple[int, dict, bytes]]]
KINDS = ("timeout", "reset", "overflow")  # why a connection ended without an answer
BUSY = error_response(503, "busy: the connection was closed for a new one")


@dataclass(eq=False)
class _Slot:
    """One open connection as the cap sees it."""
    peer: str  # ``peer_key`` of its address
    phase: str = "idle"  # idle | reading (a request) | waiting (for its turn) | answering
    turn: asyncio.Future | None = None  # while waiting
    bumped: bool = False  # closed for a new connection while reading: answered 503 on its way out


@dataclass(frozen=True)
class Peer:
    """A connection's two ends: the client's address and port, and the server's (for a handler that asks
    the kernel who owns the client's socket); ``subject``: the verified client certificate's CN, else its
    RFC 4514 subject (mutual TLS), None without one."""
    host: str
    port: int
    local_host: str | None
    local_port: int
    subject: str | None = None

    @classmethod
    def of(cls, peername: object, sockname: object, subject: str | None = None) -> Peer:
        host, port = (str(peername[0]), int(peername[1])) if isinstance(peername, tuple) and peername \
            else (str(peername), 0)
        local = sockname if isinstance(sockname, tuple) and sockname else (None, 0)
        return cls(host, port, None if local[0] is None else str(local[0]), int(local[1]), subject)


class _Stalled(Exception):
    """The client does not read its answer."""


class HttpServer:
    def __init__(self, handler: Handler, max_body: int, head_s: float, idle_s: float, max_conns: int,
                 log: logging.Logger, on_drop: Callable[[str], None] | None = None, rate: float = 0.0,
                 codings: bool = False, tls: ssl.SSLContext | None = None):
        self.handler, self.max_body, self.head_s, self.idle_s = handler, max_body, head_s, idle_s
        self.max_conns, self.log, self.on_drop = max_conns, log, on_drop
        self.conns: dict[asyncio.Task, _Slot] = {}  # every open connection, oldest first
        self.held: Counter = Counter()  # peer -> connections it holds
        self.pace = FairPace(rate) if rate else None
        self.dropped: Counter = Counter()
        self.server: asyncio.AbstractServer | None = None
        self.closing = False
        self.budget = BodyBudget(BODY_BUDGET * max_body)
        self.codings = Codings(max_body, self.budget) if codings else None  # gzip/deflate request bodies
        self.tls = tls
        self._date = (0, "")

    async def start(self, host: str, port: int) -> None:
        """Bind ``host:port`` with SO_REUSEPORT (every gateway process binds the same address and the
        kernel spreads the connections) and serve it."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(512)
        except OSError:
            sock.close()
            raise
        await self.serve(sock)

    async def serve(self, sock: socket.socket) -> None:
        """Serve an already bound and listening socket (the server owns it from now on)."""
        if self.tls is None:
            self.server = await asyncio.start_server(self._serve, sock=sock, limit=HEAD_BYTES)
        else:
            self.server = await asyncio.start_server(self._serve, sock=sock, limit=HEAD_BYTES, ssl=self.tls,
                                                     ssl_handshake_timeout=self.head_s)

    @property
    def body_bytes(self) -> int:
        """Bytes of request bodies held now (read, or being read, and not answered)."""
        return self.budget.held

    def drop(self, detail: str, peer: object, kind: str | None = None) -> None:
        self.dropped[detail] += 1
        if kind is not None and self.on_drop is not None:
            self.on_drop(kind)
        self.log.debug("http connection from %s dropped (%s): %s", peer, kind or "not counted", detail)

    def _victim(self, peer: str) -> tuple[asyncio.Task, _Slot] | None:
        """The connection a new one from ``peer`` takes the place of at the cap (module docstring); one
        pass over the connections, oldest first."""
        mine = self.held[peer]
        heavy = max(self.held, key=self.held.__getitem__)
        if self.held[heavy] < mine + 2:
            heavy = None
        first: dict[str, tuple[asyncio.Task, _Slot]] = {}  # phase -> the heavy peer's oldest in it
        fallback = None  # the oldest idle one of a peer holding as many as ``peer``
        for task, slot in self.conns.items():
            if slot.peer == heavy and slot.phase != "answering" and slot.phase not in first:
                if slot.phase == "idle":
                    return task, slot
                if slot.phase == "reading" or not slot.turn.done():  # a turn given is an answer begun
                    first[slot.phase] = task, slot
            elif fallback is None and slot.phase == "idle" and self.held[slot.peer] >= mine:
                fallback = task, slot
        return first.get("reading") or first.get("waiting") or fallback

    def _forget(self, task: asyncio.Task) -> None:
        slot = self.conns.pop(task, None)
        if slot is not None:
            self.held[slot.peer] -= 1
            if not self.held[slot.peer]:
                del self.held[slot.peer]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        subject = None if self.tls is None else subject_text(writer.get_extra_info("peercert"))
        ends = Peer.of(peer, writer.get_extra_info("sockname"), subject)
        key = peer_key(ends.host)
        if len(self.conns) >= self.max_conns and not self.closing:
            victim = self._victim(key)
            if victim is not None:  # no peer's connections lock another peer out
                task, slot = victim
                self._forget(task)
                if slot.phase == "waiting":  # its request is answered 503, then it closes
                    FairPace.cancel_turn(slot.turn)
                else:
                    slot.bumped = slot.phase == "reading"
                    task.cancel()
                self.drop(f"{slot.phase}, closed for a new connection", slot.peer, "overflow")
        if len(self.conns) >= self.max_conns or self.closing:
            self.drop("too many connections", peer, "overflow")
            writer.transport.abort()
            return
        task = asyncio.current_task()
        slot = self.conns[task] = _Slot(key)
        self.held[key] += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Reader(self.budget, self.max_body, self.head_s, writer)
        try:
            while not self.closing and await self._next(conn, reader, writer, peer, ends):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            self.drop("closed by the client", peer, "reset")
        except _Stalled:
            self.drop("answer not read in time", peer, "timeout")
        except asyncio.CancelledError:  # close() cut it: end quietly (asyncio would log a cancelled handler)
            if slot.bumped:  # a request started: it gets an answer that says why
                with contextlib.suppress(Exception):
                    await self._reply(writer, *BUSY, False)
        finally:
            self._forget(task)
            conn.release()
            await self._close(reader, writer)

    async def _next(self, conn: Reader, reader, writer, peer: object, ends: Peer) -> bool:
        """Answer one parsed request, or read more; False when the connection is to close."""
        slot = self.conns.get(asyncio.current_task())
        if slot is None:  # closed for a new connection (a waiting request was answered already)
            return False
        if conn.ready:
            return await self._answer(conn, conn.ready.popleft(), writer, ends, slot)
        slot.phase = "idle" if conn.state == "idle" else "reading"
        if conn.state == "idle":
            what, budget = "idle", self.idle_s
        elif conn.state == "head":
            what, budget = "slow request head", max(0.0, conn.deadline - time.monotonic())
        else:
            what = "slow request body"
            budget = max(0.0, conn.deadline + (conn.size + BODY_CHUNK) / MIN_RATE - time.monotonic())
        try:  # asyncio.timeout, not wait_for: no task per read (a measurable cost per request)
            async with asyncio.timeout(budget):
                data = await reader.read(BODY_CHUNK if conn.state == "body" else HEAD_BYTES)
        except asyncio.TimeoutError:
            self.drop(what, peer, "timeout" if what != "idle" or not conn.answered else None)
            if what != "idle":
                part = "head" if conn.state == "head" else "body"
                await self._reply(writer, *error_response(408, f"request {part} not received in time"), False)
            return False
        if not data:  # the client closed: a drop unless it had all its answers
            if conn.state != "idle" or not conn.answered:
                self.drop("closed by the client", peer, "reset")
            return False
        try:
            conn.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return await self._refuse(writer, peer, HttpError(400, "protocol upgrades are not served"))
        except httptools.HttpParserError as exc:
            return await self._refuse(writer, peer, parser_error(exc))
        if conn.state == "head":  # a head still incomplete: the bytes the parser holds of it
            conn.raw_head += len(data)
            if conn.raw_head > HEAD_BYTES:
                too_big = HttpError(431, f"request head over {HEAD_BYTES} bytes")
                return await self._refuse(writer, peer, too_big)
        return True

    async def _refuse(self, writer, peer: object, exc: HttpError) -> bool:
        reason = {413: "body over the limit", 503: "bodies over the memory budget",
                  431: "request head too large"}.get(exc.status, f"bad request ({exc.status})")
        self.drop(reason, peer)
        await self._reply(writer, *error_response(exc.status, exc.message), False)
        return False

    async def _answer(self, conn: Reader, req: Request, writer, ends: Peer, slot: _Slot) -> bool:
        if self.pace is not None:
            slot.phase, slot.turn = "waiting", self.pace.ticket(slot.peer)
            try:
                if slot.turn is not None:
                    await slot.turn
            except Bumped:
                self.budget.give(req.held)
                await self._reply(writer, *BUSY, False)
                return False
            except asyncio.CancelledError:  # close() cut it: its body bytes are no longer held
                self.budget.give(req.held)
                raise
        slot.phase, slot.turn = "answering", None
        try:
            if self.codings is not None:
                await self.codings.decode(req)
            status, rheaders, rbody = await self.handler(req.method, req.path, req.query, req.headers,
                                                         req.body, ends)
        except HttpError as exc:
            status, rheaders, rbody = error_response(exc.status, exc.message)
        except Exception as exc:  # a bug answers 500; the connection and the gateway go on
            self.log.exception("http handler failed on %s %s", req.method, req.path)
            status, rheaders, rbody = error_response(500, f"internal error: {type(exc).__name__}")
        finally:
            self.budget.give(req.held)
        await self._reply(writer, status, rheaders, rbody, req.keep, head_only=req.method == "HEAD",
                          announce_keep=req.http10)
        conn.answered += 1
        return req.keep

    async def _close(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Close so that the client reads our last answer: flush it, half-close, then discard what the
        client still sends for a moment (closing with unread input would reset the connection and could
        destroy the answer, e.g. a 413 sent before the body was read)."""
        try:
            async with asyncio.timeout(1.0):
                await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()
                for _ in range(64):
                    if not await reader.read(1 << 16):
                        break
        except (Exception, asyncio.CancelledError):
            pass
        writer.transport.abort()

    def date(self) -> str:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]

    async def _reply(self, writer: asyncio.StreamWriter, status: int, headers: dict, body: bytes, keep: bool,
                     head_only: bool = False, announce_keep: bool = False) -> None:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", f"Date: {self.date()}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if not keep:
            lines.append("Connection: close")
        elif announce_keep:
            lines.append("Connection: keep-alive")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body))
        if writer.transport.get_write_buffer_size() > 1 << 16:
            try:
                async with asyncio.timeout(self.head_s + len(body) / MIN_RATE):
                    await writer.drain()
            except asyncio.TimeoutError:
                raise _Stalled from None

    async def close(self, grace_s: float) -> None:
        """Stop accepting; let requests being answered finish for up to ``grace_s``, then cut the rest."""
        self.closing = True
        if self.server is not None:
            self.server.close()
        for task, slot in list(self.conns.items()):
            if slot.phase == "idle":
                task.cancel()
        busy = [t for t, s in self.conns.items() if s.phase != "idle"]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        rest = list(self.conns)
        for task in rest:
            task.cancel()
        if rest:  # each ends in its ``finally`` (at most ``_close``'s second): nothing left pending
            await asyncio.wait(rest, timeout=2.0)
        if self.pace is not None:
            self.pace.close()
        if self.codings is not None:
            self.codings.close()
