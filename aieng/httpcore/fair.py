"""Sharing one HTTP server between its peers, so that no one peer can starve another.

``peer_key`` names the peer a connection comes from: its IPv4 address, or the /64 of its IPv6 address (one
host holds a whole /64, so counting its addresses one by one would count nothing).  The server counts the
connections each peer holds by this key (``server.HttpServer``: at its cap a new connection takes the place
of one held by a peer holding more).

``FairPace`` hands out at most ``rate`` turns a second and, when requests wait for a turn, takes the peers
in turn (round robin, one request each): a request from a peer with nothing waiting waits behind at most
one request of every other waiting peer, however many one of them sent.  A waiting request is a
``Future`` from ``ticket``; ``cancel_turn`` takes it out of the line (its waiter gets ``Bumped``).  There
is no bound on waiting here: each connection has at most one request answered at a time, so the
server's connection cap bounds it.
"""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import time
from collections import deque


class Bumped(Exception):
    """The request lost its place in line (its connection was closed for a new one)."""


@functools.lru_cache(maxsize=4096)
def peer_key(host: str) -> str:
    """The peer ``host`` counts as: the address itself, an IPv4-mapped one as IPv4, an IPv6 one's /64."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:  # a Unix socket's path, or nothing: every such client is one peer
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr)


class FairPace:
    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self.next_at = 0.0  # monotonic time of the next free turn
        self.lines: dict[str, deque[asyncio.Future]] = {}  # peer -> its waiting requests; order = the ring
        self.pump: asyncio.Task | None = None

    def ticket(self, peer: str) -> asyncio.Future | None:
        """None: the turn is now.  Else a future that is done when the turn comes (await it)."""
        now = time.monotonic()
        if not self.lines and now >= self.next_at:
            self.next_at = now + self.interval
            return None
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.lines.setdefault(peer, deque()).append(fut)
        if self.pump is None:
            self.pump = loop.create_task(self._pump())
        return fut

    @staticmethod
    def cancel_turn(fut: asyncio.Future) -> bool:
        """Take a waiting request out of the line; False when its turn has already come."""
        if fut.done():
            return False
        fut.set_exception(Bumped())
        return True

    @property
    def waiting(self) -> int:
        return sum(1 for line in self.lines.values() for f in line if not f.done())

    def _next(self) -> asyncio.Future | None:
        """The next peer's oldest waiting request (that peer goes to the back of the ring)."""
        while self.lines:
            peer = next(iter(self.lines))
            line = self.lines.pop(peer)
            fut = line.popleft()
            if line:
                self.lines[peer] = line
            if not fut.done():  # done: bumped, or its waiter went (a cancelled task cancels it)
                return fut
        return None

    async def _pump(self) -> None:
        try:
            while self.lines:
                delay = self.next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                fut = self._next()
                if fut is not None:
                    fut.set_result(None)
                    # a late wake-up does not bank turns: the rate holds over any window
                    self.next_at = max(self.next_at, time.monotonic()) + self.interval
        finally:
            self.pump = None

    def close(self) -> None:
        if self.pump is not None:
            self.pump.cancel()
