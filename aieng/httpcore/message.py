"""One connection's HTTP/1.1 requests as ``httptools`` (llhttp) parses them, checked as they arrive.

``Reader`` gets the parser's callbacks and queues complete ``Request``s; a request over a limit raises
``HttpError`` from inside a callback (llhttp then stops and ``parser_error`` recovers it).  Framing is
llhttp's: Content-Length or chunked bodies; Transfer-Encoding beside Content-Length is a parse error
(400); a coding other than chunked is 501; HTTP other than 1.0/1.1 is 505; a head over ``HEAD_BYTES``
is 431; a body over ``max_body`` is 413 (before reading it when announced); a body whose next bytes do
not fit the server's ``BodyBudget`` (``BODY_BUDGET`` x ``max_body`` bytes in memory) is 503.

A body costs memory in proportion to its bytes however it is framed: its pieces are gathered in one
``bytearray`` (a piece per chunk would be a Python object per chunk: 1-byte chunks cost ~90 bytes of
memory per body byte), and a body that came in one piece is kept as it came, not copied.
"""
from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httptools

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

HEAD_BYTES = 64 * 1024
MIN_RATE = 1 << 20  # bytes/s: a body (and an answer) must move at least this fast after ``head_s``
BODY_BUDGET = 4
BODY_CHUNK = 1 << 20  # a body is read, and counted against the budget, this much at a time
REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 413: "Payload Too Large",
           415: "Unsupported Media Type",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported"}


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def error_response(status: int, message: str) -> tuple[int, dict, bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps({"error": message}).encode()


class BodyBudget:
    """The bytes of request bodies one server holds now (read, or being read, and not answered)."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0

    def take(self, n: int) -> None:
        if self.held + n > self.limit:
            raise HttpError(503, "too many large requests at once")
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


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


class Reader:
    """The parser's callbacks for one connection: builds ``Request``s, checks them as they arrive."""

    def __init__(self, budget: BodyBudget, max_body: int, head_s: float, writer: "asyncio.StreamWriter"):
        self.budget, self.max_body, self.head_s, self.writer = budget, max_body, head_s, writer
        self.parser = httptools.HttpRequestParser(self)
        self.ready: deque[Request] = deque()
        self.state = "idle"  # idle -> head -> body -> idle
        self.url, self.headers, self.body, self.size = bytearray(), {}, b"", 0
        self.deadline = 0.0  # the head's, from its first byte; then the body's base, from its start
        self.head_bytes = 0  # the head's size, from the parser's callbacks
        self.raw_head = 0  # bytes read while the head is incomplete (what the parser may be holding)
        self.answered = 0  # requests answered on this connection

    def on_message_begin(self) -> None:
        self.state, self.url, self.headers, self.body, self.size = "head", bytearray(), {}, b"", 0
        self.deadline, self.head_bytes, self.raw_head = time.monotonic() + self.head_s, 0, 0

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
        self.state, self.deadline = "body", time.monotonic() + self.head_s
        if self.parser.get_http_version() not in ("1.0", "1.1"):
            raise HttpError(505, f"unsupported protocol version {self.parser.get_http_version()[:16]!r}")
        coding = self.headers.get("transfer-encoding")
        if coding is not None and coding.lower() != "chunked":
            raise HttpError(501, f"transfer coding {coding[:40]!r} is not supported (only chunked)")
        announced = int(self.headers.get("content-length", "0")) if coding is None else 0  # digits: llhttp's
        if announced > self.max_body:
            raise HttpError(413, f"body of {announced} bytes is over the limit of {self.max_body}")
        if (announced or coding) and self.headers.get("expect", "").lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.size + len(body) > self.max_body:
            raise HttpError(413, f"body over the limit of {self.max_body} bytes")
        self.budget.take(len(body))
        self.size += len(body)
        if not self.body:
            self.body = body  # the common case, one piece: kept, not copied
        else:
            if not isinstance(self.body, bytearray):
                self.body = bytearray(self.body)
            self.body += body

    def on_message_complete(self) -> None:
        http10 = self.parser.get_http_version() == "1.0"
        conn = self.headers.get("connection", "").lower()
        keep = conn == "keep-alive" if http10 else conn != "close"
        path, _, query = self.url.decode("latin-1").partition("?")
        method = self.parser.get_method().decode("latin-1")
        body = bytes(self.body) if isinstance(self.body, bytearray) else self.body
        self.ready.append(Request(method, unquote(path), query, self.headers, body, keep, http10, self.size))
        self.state, self.body, self.size = "idle", b"", 0

    def release(self) -> None:
        """Give back the body bytes of everything parsed and not answered (the connection is ending)."""
        self.budget.give(self.size + sum(r.held for r in self.ready))
        self.size = 0
        self.ready.clear()


def parser_error(exc: Exception) -> HttpError:
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, HttpError):
        return cause
    return HttpError(400, f"malformed request: {str(exc)[:120]}")
