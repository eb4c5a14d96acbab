"""An asyncio HTTP/1.1 server for the OIP REST side: ``httptools`` (llhttp, Node's parser) reads the
messages, this module holds the limits.  A connection costs a file descriptor and a coroutine, never a
thread, and every way of holding one is bounded:

    idle                 an open connection with no request started: closed after ``idle_s``
    head                 the request line and headers: at most ``HEAD_BYTES`` (431), complete within
                         ``head_s`` of its first byte (408), else the connection is closed
    body                 Content-Length or chunked, at most ``max_body`` bytes (413; before reading when
                         announced), arriving at ``MIN_RATE`` bytes/s or better after ``head_s`` (408)
    framing              Transfer-Encoding with Content-Length: 400 (request smuggling behind a proxy);
                         a transfer coding other than chunked: 501; HTTP other than 1.0/1.1: 505
    bodies in memory     at most ``BODY_BUDGET`` x ``max_body`` bytes received and not yet answered per
                         process, counted as the bytes arrive: a body whose next bytes do not fit is 503
    connections          at most ``max_conns`` per process; at the cap a new connection closes the one
                         idle longest (no request under way), and is closed at once only when none is idle
    answers              one at a time per connection, in order (pipelined requests wait their turn),
                         each with ``Date``; HTTP/1.0 keeps the connection only when asked (and says so)

Each refusal is one DEBUG log line and a count in ``dropped`` (by reason), never a traceback.  The
handler gets ``(method, path, query, headers, body, peer)`` (peer: the client's IP address) and returns
``(status, headers, body)``; an exception from it is a 500 with ``{"error": ...}``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass
from email.utils import formatdate
from typing import Awaitable, Callable
from urllib.parse import unquote

import httptools

HEAD_BYTES = 64 * 1024
MIN_RATE = 1 << 20
BODY_BUDGET = 4
BODY_CHUNK = 1 << 20  # a body is read, and counted against the budget, this much at a time
REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 413: "Payload Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported"}
Handler = Callable[[str, str, str, dict, bytes, str], Awaitable[tuple[int, dict, bytes]]]


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def error_response(status: int, message: str) -> tuple[int, dict, bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps({"error": message}).encode()


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep: bool
    http10: bool
    held: int  # body bytes counted in the server's ``body_bytes`` until answered


class _Reader:
    """The parser's callbacks for one connection: builds ``Request``s, checks them as they arrive."""

    def __init__(self, server: "HttpServer", writer: asyncio.StreamWriter):
        self.server, self.writer = server, writer
        self.parser = httptools.HttpRequestParser(self)
        self.ready: deque[Request] = deque()
        self.state = "idle"  # idle -> head -> body -> idle
        self.url, self.headers, self.chunks, self.size = bytearray(), {}, [], 0
        self.deadline = 0.0  # the head's, from its first byte; then the body's base, from its start
        self.head_bytes = 0  # the head's size, from the parser's callbacks
        self.raw_head = 0  # bytes read while the head is incomplete (what the parser may be holding)

    def on_message_begin(self) -> None:
        self.state, self.url, self.headers, self.chunks, self.size = "head", bytearray(), {}, [], 0
        self.deadline, self.head_bytes, self.raw_head = time.monotonic() + self.server.head_s, 0, 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.count_head(len(url))

    def count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > HEAD_BYTES:
            raise HttpError(431, f"request head over {HEAD_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count_head(len(name) + len(value) + 4)
        key, val = name.decode("latin-1").lower(), value.decode("latin-1").strip()
        self.headers[key] = f"{self.headers[key]}, {val}" if key in self.headers else val

    def on_headers_complete(self) -> None:
        self.state, self.deadline = "body", time.monotonic() + self.server.head_s
        if self.parser.get_http_version() not in ("1.0", "1.1"):
            raise HttpError(505, f"unsupported protocol version {self.parser.get_http_version()[:16]!r}")
        coding = self.headers.get("transfer-encoding")
        if coding is not None and coding.lower() != "chunked":
            raise HttpError(501, f"transfer coding {coding[:40]!r} is not supported (only chunked)")
        announced = int(self.headers.get("content-length", "0")) if coding is None else 0  # digits: llhttp's
        if announced > self.server.max_body:
            raise HttpError(413, f"body of {announced} bytes is over the limit of {self.server.max_body}")
        if (announced or coding) and self.headers.get("expect", "").lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        srv = self.server
        if self.size + len(body) > srv.max_body:
            raise HttpError(413, f"body over the limit of {srv.max_body} bytes")
        if srv.body_bytes + len(body) > BODY_BUDGET * srv.max_body:
            raise HttpError(503, "too many large requests at once")
        srv.body_bytes += len(body)
        self.size += len(body)
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        http10 = self.parser.get_http_version() == "1.0"
        conn = self.headers.get("connection", "").lower()
        keep = conn == "keep-alive" if http10 else conn != "close"
        path, _, query = self.url.decode("latin-1").partition("?")
        method = self.parser.get_method().decode("latin-1")
        body = b"".join(self.chunks)
        self.ready.append(Request(method, unquote(path), query, self.headers, body, keep, http10, self.size))
        self.state, self.chunks, self.size = "idle", [], 0

    def release(self) -> None:
        """Give back the body bytes of everything parsed and not answered (the connection is ending)."""
        self.server.body_bytes -= self.size + sum(r.held for r in self.ready)
        self.size = 0
        self.ready.clear()


def _parser_error(exc: Exception) -> HttpError:
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, HttpError):
        return cause
    return HttpError(400, f"malformed request: {str(exc)[:120]}")


class HttpServer:
    def __init__(self, handler: Handler, max_body: int, head_s: float, idle_s: float, max_conns: int,
                 log: logging.Logger):
        self.handler, self.max_body, self.head_s, self.idle_s = handler, max_body, head_s, idle_s
        self.max_conns, self.log = max_conns, log
        self.conns: dict[asyncio.Task, bool] = {}  # connection -> answering a request now
        self.dropped: Counter = Counter()
        self.server: asyncio.AbstractServer | None = None
        self.closing = False
        self.body_bytes = 0  # bytes of request bodies held now (read, or being read)
        self._date = (0, "")

    async def start(self, host: str, port: int) -> None:
        # SO_REUSEPORT: every gateway process binds the same address and the kernel spreads connections.
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(512)
        self.server = await asyncio.start_server(self._serve, sock=sock, limit=HEAD_BYTES)

    def drop(self, reason: str, peer: object) -> None:
        self.dropped[reason] += 1
        self.log.debug("http connection from %s dropped: %s", peer, reason)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if len(self.conns) >= self.max_conns and not self.closing:
            idle = next((t for t, busy in self.conns.items() if not busy), None)  # the oldest idle one
            if idle is not None:  # idle connections cannot lock everyone else out
                self.conns.pop(idle)
                idle.cancel()
                self.drop("idle, closed for a new connection", peer)
        if len(self.conns) >= self.max_conns or self.closing:
            self.drop("too many connections", peer)
            writer.transport.abort()
            return
        task = asyncio.current_task()
        self.conns[task] = False
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Reader(self, writer)
        host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
        try:
            while not self.closing and await self._next(conn, reader, writer, peer, host):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            self.drop("closed by the client", peer)
        except asyncio.CancelledError:  # close() cut it: end quietly (asyncio would log a cancelled handler)
            pass
        finally:
            self.conns.pop(task, None)
            conn.release()
            await self._close(reader, writer)

    async def _next(self, conn: _Reader, reader, writer, peer: object, host: str) -> bool:
        """Answer one parsed request, or read more; False when the connection is to close."""
        task = asyncio.current_task()
        if conn.ready:
            self.conns[task] = True
            return await self._answer(conn, conn.ready.popleft(), writer, host)
        self.conns[task] = conn.state != "idle"
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
            self.drop(what, peer)
            if what != "idle":
                part = "head" if conn.state == "head" else "body"
                await self._reply(writer, *error_response(408, f"request {part} not received in time"), False)
            return False
        if not data:
            return False
        try:
            conn.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return await self._refuse(writer, peer, HttpError(400, "protocol upgrades are not served"))
        except httptools.HttpParserError as exc:
            return await self._refuse(writer, peer, _parser_error(exc))
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

    async def _answer(self, conn: _Reader, req: Request, writer, host: str) -> bool:
        try:
            status, rheaders, rbody = await self.handler(req.method, req.path, req.query, req.headers,
                                                         req.body, host)
        except HttpError as exc:
            status, rheaders, rbody = error_response(exc.status, exc.message)
        except Exception as exc:  # a bug answers 500; the connection and the gateway go on
            self.log.exception("http handler failed on %s %s", req.method, req.path)
            status, rheaders, rbody = error_response(500, f"internal error: {type(exc).__name__}")
        finally:
            self.body_bytes -= req.held
        await self._reply(writer, status, rheaders, rbody, req.keep, head_only=req.method == "HEAD",
                          announce_keep=req.http10)
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
            await writer.drain()

    async def close(self, grace_s: float) -> None:
        """Stop accepting; let requests being answered finish for up to ``grace_s``, then cut the rest."""
        self.closing = True
        if self.server is not None:
            self.server.close()
        for task, busy in list(self.conns.items()):
            if not busy:
                task.cancel()
        busy = [t for t, b in self.conns.items() if b]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for task in list(self.conns):
            task.cancel()
