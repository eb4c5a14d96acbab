"""One asyncio request/reply core over a ZeroMQ DEALER: what ``AsyncClient``, each endpoint of
``AsyncReplicaClient``, the gateway's ``Upstream`` and its admin ``Repository`` share (docs/protocol.md).

A request is one msgpack map in one frame carrying ``id`` (the caller's, else an int never pending; an id
already pending is refused, ``ValueError``); its reply is the map with the same ``id``, delivered only to a
pending request: a timed-out or cancelled one leaves the map at once, so its late reply is dropped
(``unmatched``; core ids are never reused); an undecodable or id-less reply is counted ``malformed`` and
skipped, never the reader's death.  One reader (the loop watching the socket's edge-triggered descriptor,
drained after sends too).  At most ``max_pending`` in flight (``RpcFull``).  ZMQ reconnects by itself; a
request sent while disconnected waits in the socket's queue (HWM 0: bounded by ``max_pending``) and fails
``RpcTimeout`` at its deadline (with ``sockopts={zmq.IMMEDIATE: 1}``: ``RpcUnsent`` at once).
``on_state(connected)`` (optional) is told each completed handshake and each lost connection, after the
replies already received were delivered; ``fail_pending(error)`` fails what is pending (e.g. ``RpcLost``:
its replies can no longer come).  ``close`` fails every pending request once (``RpcClosed``), later calls too.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Callable

import msgpack
import zmq
from zmq.utils.monitor import parse_monitor_message

Curve = tuple[bytes, bytes, bytes]  # (client public, client secret, server public), z85 keys
STATE_EVENTS = {zmq.EVENT_HANDSHAKE_SUCCEEDED: True, zmq.EVENT_DISCONNECTED: False}
# plain ints: ``&`` or ``|`` with pyzmq's enum flags is Python code (enum.Flag), several times a request
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


class RpcError(Exception):
    """The core's own failures; each user maps them onto its error type."""


class RpcTimeout(RpcError, TimeoutError):
    """No reply within the request's time."""


class RpcClosed(RpcError, ConnectionError):
    """The core was closed before the reply came (or before the call)."""


class RpcUnsent(RpcError, ConnectionError):
    """The socket refused the send (the ZMQ error is the message)."""


class RpcLost(RpcError, ConnectionError):
    """The connection dropped before the reply came (what a user passes to ``fail_pending``)."""


class RpcFull(RpcError):
    """``max_pending`` requests are in flight already."""


def unpack(raw: Any) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


class RpcCore:
    """One DEALER, its pending map and its reader (see the module docstring)."""

    def __init__(self, addr: str, curve: Curve | None = None, decode: Callable[[Any], Any] = unpack,
                 max_pending: int = 65536, log: logging.Logger | None = None,
                 ctx: zmq.Context | None = None, sockopts: dict[int, int] | None = None,
                 on_state: Callable[[bool], None] | None = None):
        self.addr, self.decode, self.max_pending, self.on_state = addr, decode, max_pending, on_state
        self.log = log or logging.getLogger("aieng.client.core")
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)  # bounded by max_pending, not a queue size
        self.sock.setsockopt(zmq.RCVHWM, 0)
        if curve is not None:
            self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = curve
        for opt, value in (sockopts or {}).items():
            self.sock.setsockopt(opt, value)
        # the monitor before connect: no event is missed; None when nobody asked for connection states
        self.mon = self.sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED) if on_state is not None else None
        self.connected: bool | None = None  # as the monitor last said (None: not watched or not yet)
        self.sock.connect(addr)
        self.fd = self.sock.getsockopt(zmq.FD)
        self.ids = itertools.count(1)
        self.pending: dict[Any, asyncio.Future] = {}
        self.counts = {"sent": 0, "replies": 0, "unmatched": 0, "malformed": 0, "timeouts": 0}
        self.loop: asyncio.AbstractEventLoop | None = None
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
        if self.mon is not None:
            loop.add_reader(self.mon.getsockopt(zmq.FD), self._watch)
            loop.call_soon(self._watch)  # events from before the loop watched (the edge is gone)

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
                self.sock.send(msgpack.packb(request, use_bin_type=True), NOBLOCK)
            except zmq.ZMQError as exc:
                raise RpcUnsent(str(exc)) from None
            self.counts["sent"] += 1
            # the send may have consumed the descriptor's edge: read what is there now (a check, not
            # a turn of the loop per request; a reply arriving later raises a new edge)
            if self.sock.get(EVENTS) & POLLIN:
                self._drain()
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
        while not self.closed and self.sock.get(EVENTS) & POLLIN:
            try:
                frames = self.sock.recv_multipart(NOBLOCK, copy=False)
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

    def _watch(self) -> None:
        """The monitor woke: deliver the replies already received, then tell ``on_state`` each change."""
        self._drain()
        while not self.closed and self.mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                event = parse_monitor_message(self.mon.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return
            if event not in STATE_EVENTS:
                continue
            self.connected = STATE_EVENTS[event]
            try:
                self.on_state(self.connected)
            except Exception:  # noqa: BLE001 - the user's callback never stops the reader
                self.log.exception("the connection-state callback for %s failed", self.addr)

    def fail_pending(self, error: Callable[[], BaseException]) -> int:
        """Fail every pending request now with its own ``error()``; they leave the map, so a reply that
        still comes is dropped (``unmatched``).  Returns how many were failed."""
        pending, self.pending = self.pending, {}
        failed = 0
        for fut in pending.values():
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_exception(error())
                failed += 1
        return failed

    def close(self) -> None:
        """Stop reading, fail every pending request once, close the socket (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
            if self.mon is not None:
                self.loop.remove_reader(self.mon.getsockopt(zmq.FD))
        self.fail_pending(lambda: RpcClosed(f"the connection to {self.addr} was closed"))
        if self.mon is not None:
            self.sock.disable_monitor()
            self.mon.close(0)
        self.sock.close(0)
