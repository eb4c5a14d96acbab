"""HTTP content codings (gzip, deflate): request bodies inflated within the server's limits; the pieces a
handler compresses its answers with.

    request    ``Content-Encoding: gzip`` or ``deflate`` (zlib's format, as HTTP and Triton's clients mean
               it; ``identity`` or none: as it came): inflated a slice at a time, never past ``max_body``
               bytes (413, naming the limit: a zip bomb stops there), a corrupt or truncated stream 400,
               any other coding (or a list of them) 415.  The handler sees the inflated body and no
               ``Content-Encoding``; its bytes count in the server's body budget until answered (503
               over it), like a body that came as it is
    response   left to the handler, which knows which answers a client can read compressed (Triton's
               clients decompress infer answers only; aiohttp asks for gzip on every call):
               ``response_coding`` reads ``Accept-Encoding`` (gzip or deflate, q > 0, gzip preferred at
               equal q), ``compress`` compresses (zlib's fastest level)
    off loop   a coding whose work can pass ``OFF_LOOP_BYTES`` (deflate inflates at most ``MAX_RATIO``:1,
               so a body's compressed size bounds it) runs on one thread of its own, as the OIP decoder
               does: big bodies wait for each other instead of stalling every connection
"""
from __future__ import annotations

import asyncio
import gzip
import zlib
from concurrent.futures import ThreadPoolExecutor

from aieng.httpcore.message import BodyBudget, HttpError, Request

CODINGS = ("gzip", "deflate")
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
MAX_RATIO = 1032  # deflate's most: what a compressed body of n bytes can inflate to is at most ~1032 n
SLICE = 1 << 20  # inflated bytes per step: the limit is checked between steps
OFF_LOOP_BYTES = 256 << 10
LEVEL = 1  # zlib's fastest: an answer's compression costs the gateway's loop, not the client's


def inflate(body: bytes, coding: str, limit: int) -> bytes:
    """``body`` decoded from ``coding``, refused (``HttpError``) past ``limit`` bytes or when corrupt.
    A gzip body may hold several members, one after another (RFC 1952)."""
    out: list[bytes] = []
    size, data = 0, body
    while True:
        d = zlib.decompressobj(WBITS[coding])
        while True:
            try:
                piece = d.decompress(data, min(SLICE, limit + 1 - size))
            except zlib.error as exc:
                raise HttpError(400, f"malformed {coding} body: {exc}") from None
            size += len(piece)
            if size > limit:
                raise HttpError(413, f"body inflates past the limit of {limit} bytes ({coding})")
            out.append(piece)
            data = d.unconsumed_tail
            if d.eof or (not data and not piece):
                break
        if not d.eof:
            raise HttpError(400, f"malformed {coding} body: the stream ends early")
        data = d.unused_data
        if not data:
            return b"".join(out)
        if coding != "gzip":
            raise HttpError(400, f"malformed {coding} body: {len(data)} bytes after the stream's end")


def compress(body: bytes, coding: str) -> bytes:
    if coding == "gzip":
        return gzip.compress(body, LEVEL, mtime=0)
    return zlib.compress(body, LEVEL)


def request_coding(headers: dict) -> str | None:
    """The request body's coding (None: as it came), or 415."""
    value = headers.get("content-encoding", "").strip().lower()
    if value in ("", "identity"):
        return None
    if value not in CODINGS:
        raise HttpError(415, f"content coding {value[:40]!r} is not supported (gzip, deflate or identity)")
    return value


def response_coding(headers: dict) -> str | None:
    """The coding ``Accept-Encoding`` prefers among ours (None: send as it is)."""
    best, best_q = None, 0.0
    for item in headers.get("accept-encoding", "").split(","):
        name, _, params = item.strip().lower().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        name = name.strip()
        if name.startswith("x-"):
            name = name[2:]  # x-gzip is gzip (RFC 9110)
        if name in CODINGS and (q > best_q or (q == best_q and name == "gzip")):
            best, best_q = name, q
    return best if best_q > 0 else None


class Codings:
    """One server's request codings: ``decode`` inflates a request's body in place."""

    def __init__(self, max_body: int, budget: BodyBudget):
        self.max_body, self.budget = max_body, budget
        self.pool: ThreadPoolExecutor | None = None  # made on the first big body

    async def _run(self, work: int, fn, *args):
        if work <= OFF_LOOP_BYTES:
            return fn(*args)
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="http-coding")
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def decode(self, req: Request) -> None:
        """Replace an encoded body by its inflated bytes, counted in the budget (``req.held``)."""
        coding = request_coding(req.headers)
        if coding is None:
            return
        body = await self._run(min(len(req.body) * MAX_RATIO, self.max_body), inflate, req.body, coding,
                               self.max_body)
        self.budget.take(len(body))  # 503 when over: the server gives back ``req.held`` either way
        req.held += len(body)
        req.body = body
        req.headers = {k: v for k, v in req.headers.items() if k != "content-encoding"}
        req.headers["content-length"] = str(len(body))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
