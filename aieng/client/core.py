"""One asyncio request/reply core over a ZeroMQ DEALER: what ``AsyncClient``, the gateway's ``Upstream``
and its admin ``Repository`` client share.

A request is one msgpack map in one frame carrying ``id``; its reply is the map with the same ``id``.
``call`` uses the caller's ``id`` or allocates an int (never one pending); an id already pending is
refused (``ValueError``).  One reader (the socket's descriptor watched by the loop: a send is one
non-blocking call, each wake-up drains every waiting reply; ZMQ's descriptor is edge-triggered, so it
drains after sends too) matches replies to the pending map.  A reply is delivered only to a pending
request with its id: a timed-out or cancelled request leaves the map at once, so its late reply is
dropped (counted ``unmatched``, core ids are never reused); an undecodable or id-less reply is counted
``malformed`` and skipped, never the reader's death.  At most ``max_pending`` in flight (``RpcFull``
beyond).  ZMQ reconnects by itself; a request sent while disconnected waits in the socket's queue
(HWM 0: bounded by ``max_pending``) and fails ``RpcTimeout`` at its deadline if no reply comes.
``close`` fails every pending request once (``RpcClosed``); later calls fail the same way.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Callable

import msgpack
import zmq

Curve = tuple[bytes, bytes, bytes]  # (client public, client secret, server public), z85 keys


class RpcError(Exception):
    """The core's own failures; each user maps them onto its error type."""


class RpcTimeout(RpcError, TimeoutError):
    """No reply within the request's time."""


class RpcClosed(RpcError, ConnectionError):
    """The core was closed before the reply came (or before the call)."""


class RpcUnsent(RpcError, ConnectionError):
    """The socket refused the send (the ZMQ error is the message)."""


class RpcFull(RpcError):
    """``max_pending`` requests are in flight already."""


def unpack(raw: Any) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


class RpcCore:
    """One DEALER, its pending map and its reader (see the module docstring)."""

    def __init__(self, addr: str, curve: Curve | None = None, decode: Callable[[Any], Any] = unpack,
                 max_pending: int = 65536, log: logging.Logger | None = None,
                 ctx: zmq.Context | None = None):
        self.addr, self.decode, self.max_pending = addr, decode, max_pending
        self.log = log or logging.getLogger("aieng.client.core")
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)  # bounded by max_pending, not a queue size
        self.sock.setsockopt(zmq.RCVHWM, 0)
        if curve is not None:
            self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = curve
        self.sock.connect(addr)
        self.fd = self.sock.getsockopt(zmq.FD)
        self.ids = itertools.count(1)
        self.pending: dict[Any, asyncio.Future] = {}
        self.counts = {"sent": 0, "replies": 0, "unmatched": 0, "malformed": 0, "timeouts": 0}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain_due = False
        self.closed = False

    def start(self) -> None:
        """Watch the socket on the running loop (``call`` does it on first use).  A core follows its
        caller to a new loop only once the old one is closed (``asyncio.run`` twice)."""
        loop = asyncio.get_running_loop()
        if loop is self.loop or self.closed:
            return
        if self.loop is not None and not self.loop.is_closed():
            raise RuntimeError(f"the connection to {self.addr} is in use on another event loop")
        self.loop = loop
        loop.add_reader(self.fd, self._drain)

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def new_id(self) -> int:
        rid = next(self.ids)
        while rid in self.pending:  # a caller's own int id may be in flight under this number
            rid = next(self.ids)
        return rid

    async def call(self, request: dict, timeout_s: float) -> dict:
        """Send ``request`` (``id`` added when absent) and return its reply map within ``timeout_s``."""
        if self.closed:
            raise RpcClosed(f"the connection to {self.addr} is closed")
        if len(self.pending) >= self.max_pending:
            raise RpcFull(f"{self.max_pending} requests in flight to {self.addr}")
        rid = request.get("id")
        if rid is None:
            rid = request["id"] = self.new_id()
        elif rid in self.pending:
            raise ValueError(f"request id {rid!r} is already in flight")
        self.start()
        loop = self.loop
        fut = loop.create_future()
        self.pending[rid] = fut
        timer = loop.call_later(timeout_s, self._expire, rid, fut, timeout_s)
        try:
            try:
                self.sock.send(msgpack.packb(request, use_bin_type=True), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                raise RpcUnsent(str(exc)) from None
            self.counts["sent"] += 1
            if not self.drain_due:  # the send may have consumed the descriptor's edge
                self.drain_due = True
                loop.call_soon(self._drain)
            return await fut
        finally:
            timer.cancel()
            if self.pending.get(rid) is fut:
                del self.pending[rid]

    def _expire(self, rid: Any, fut: asyncio.Future, timeout_s: float) -> None:
        if self.pending.get(rid) is fut:
            del self.pending[rid]
        if not fut.done():
            self.counts["timeouts"] += 1
            fut.set_exception(RpcTimeout(f"no reply from {self.addr} within {timeout_s:g}s"))

    def _drain(self) -> None:
        self.drain_due = False
        while not self.closed and self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                reply = self.decode(frames[-1].buffer)
                rid = reply["id"]
                fut = self.pending.pop(rid, None)
            except Exception as exc:  # noqa: BLE001 - a reply we cannot read answers nothing
                self.counts["malformed"] += 1
                self.log.error("undecodable reply from %s skipped: %s", self.addr, type(exc).__name__)
                continue
            if fut is None or fut.done():
                self.counts["unmatched"] += 1  # late (timed out, cancelled) or never asked
                continue
            self.counts["replies"] += 1
            fut.set_result(reply)

    def close(self) -> None:
        """Stop reading, fail every pending request once, close the socket (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_exception(RpcClosed(f"the connection to {self.addr} was closed"))
        self.sock.close(0)
