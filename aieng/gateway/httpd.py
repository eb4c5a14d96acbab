"""A small asyncio HTTP/1.1 server for the OIP REST side: keep-alive, Content-Length bodies, hard limits.

Written here rather than taken from a framework so that every limit is explicit and cheap (the
frontend's ``httpserver.py`` ideas, on asyncio): a connection costs a file descriptor and a coroutine,
never a thread, and every way of holding one is bounded:

    idle                 an open connection with no request started: closed after ``idle_s``
    head                 the request line and headers: at most ``HEAD_BYTES`` (431), complete within
                         ``head_s`` of its first byte (408), else the connection is closed
    body                 ``Content-Length`` only (chunked: 411), at most ``max_body`` bytes (413, before
                         reading it), arriving at ``MIN_RATE`` bytes/s or better after ``head_s`` (408)
    bodies in memory     at most ``BODY_BUDGET`` x ``max_body`` bytes received and not yet answered per
                         process, counted as the bytes arrive (an announced length holds nothing): a
                         body whose next chunk does not fit is 503
    connections          at most ``max_conns`` per process; at the cap a new connection closes the one
                         idle longest (no request under way), and is closed at once only when none is idle
    answers              one at a time per connection, in order (pipelined requests wait their turn)

Each refusal is one DEBUG log line and a count in ``dropped`` (by reason), never a traceback.  The
handler gets ``(method, path, query, headers, body, peer)`` (peer: the client's IP address) and returns
``(status, headers, body)``; an exception from it is a 500 with ``{"error": ...}``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import Counter
from typing import Awaitable, Callable
from urllib.parse import unquote

HEAD_BYTES = 64 * 1024
MIN_RATE = 1 << 20
BODY_BUDGET = 4
BODY_CHUNK = 1 << 20  # a body is read, and counted against the budget, this much at a time
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           411: "Length Required", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
           504: "Gateway Timeout", 505: "HTTP Version Not Supported"}
Handler = Callable[[str, str, str, dict, bytes, str], Awaitable[tuple[int, dict, bytes]]]


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def error_response(status: int, message: str) -> tuple[int, dict, bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps({"error": message}).encode()


def parse_head(head: bytes) -> tuple[str, str, str, str, dict[str, str]]:
    """``(method, path, query, version, headers)``; header names lower-cased, repeats joined by ', '."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
        raise HttpError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, f"unsupported protocol version {version[:16]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        if key == "content-length" and key in headers and headers[key] != value:
            raise HttpError(400, "conflicting Content-Length headers")
        headers[key] = f"{headers[key]}, {value}" if key in headers and key != "content-length" else value
    path, _, query = target.partition("?")
    return method, unquote(path), query, version, headers


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
        try:
            while not self.closing and await self._one(reader, writer, peer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            self.drop("closed by the client", peer)
        except asyncio.CancelledError:  # close() cut it: end quietly (asyncio would log a cancelled handler)
            pass
        finally:
            self.conns.pop(task, None)
            await self._close(reader, writer)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object) -> bool:
        """Read, answer one request; False when the connection is to close."""
        task = asyncio.current_task()
        self.conns[task] = False
        try:  # asyncio.timeout, not wait_for: no task per read (a measurable cost per request)
            async with asyncio.timeout(self.idle_s):
                first = await reader.read(1)
        except asyncio.TimeoutError:
            self.drop("idle", peer)
            return False
        if not first:
            return False
        self.conns[task] = True
        try:
            async with asyncio.timeout(self.head_s):
                rest = await reader.readuntil(b"\r\n\r\n")
                method, path, query, version, headers = parse_head(first + rest)
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    raise HttpError(411, "chunked bodies are not accepted: send Content-Length")
                length = headers.get("content-length", "0")
                if not (length.isascii() and length.isdigit()):  # "²".isdigit() is True, int("²") fails
                    raise HttpError(400, "invalid Content-Length")
                n = int(length)
                if n > self.max_body:
                    raise HttpError(413, f"body of {n} bytes is over the limit of {self.max_body}")
                if n and headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        except asyncio.TimeoutError:
            self.drop("slow request head", peer)
            await self._reply(writer, *error_response(408, "request head not received in time"), False)
            return False
        except (asyncio.LimitOverrunError, ValueError):
            self.drop("request head too large", peer)
            await self._reply(writer, *error_response(431, f"request head over {HEAD_BYTES} bytes"), False)
            return False
        except HttpError as exc:
            self.drop(f"bad request head ({exc.status})", peer)
            await self._reply(writer, *error_response(exc.status, exc.message), False)
            return False
        held = [0]  # body bytes of this request counted in ``body_bytes`` (released when it is answered)
        try:
            return await self._answer(reader, writer, n, method, path, query, version, headers, peer, held)
        finally:
            self.body_bytes -= held[0]

    async def _read_body(self, reader: asyncio.StreamReader, n: int, held: list) -> bytes | None:
        """The body, counted against the budget as its bytes arrive; None when a chunk does not fit."""
        chunks = []
        while held[0] < n:
            chunk = await reader.read(min(BODY_CHUNK, n - held[0]))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", n)
            if self.body_bytes + len(chunk) > BODY_BUDGET * self.max_body:
                return None
            self.body_bytes += len(chunk)
            held[0] += len(chunk)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _answer(self, reader, writer, n: int, method: str, path: str, query: str, version: str,
                      headers: dict, peer: object, held: list) -> bool:
        try:
            async with asyncio.timeout(self.head_s + n / MIN_RATE):
                body = await self._read_body(reader, n, held) if n else b""
        except asyncio.TimeoutError:
            self.drop("slow request body", peer)
            await self._reply(writer, *error_response(408, "request body not received in time"), False)
            return False
        if body is None:
            self.drop("bodies over the memory budget", peer)
            await self._reply(writer, *error_response(503, "too many large requests at once"), False)
            return False
        keep = headers.get("connection", "").lower() != "close" and (
            version == "HTTP/1.1" or headers.get("connection", "").lower() == "keep-alive")
        try:
            host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
            status, rheaders, rbody = await self.handler(method, path, query, headers, body, host)
        except HttpError as exc:
            status, rheaders, rbody = error_response(exc.status, exc.message)
        except Exception as exc:  # a bug answers 500; the connection and the gateway go on
            self.log.exception("http handler failed on %s %s", method, path)
            status, rheaders, rbody = error_response(500, f"internal error: {type(exc).__name__}")
        await self._reply(writer, status, rheaders, rbody, keep, head_only=method == "HEAD")
        return keep

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

    async def _reply(self, writer: asyncio.StreamWriter, status: int, headers: dict, body: bytes, keep: bool,
                     head_only: bool = False) -> None:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if not keep:
            lines.append("Connection: close")
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
