"""Rows in flight per OIP peer, so one client of a gateway cannot deny the others.

``gateway_share``: the rows one gateway may hold in flight at the frontend: half of ``AIENG_MAX_INFLIGHT``
split between the gateways, never more than the frontend's per-client limit.  ``PeerBudget``: within that
share one peer holds at most half.  A peer is a principal (``principal.py``: an API key's principal, all its
connections and addresses together), else a client IP address (all its connections together).  ``take`` admits
a request's rows whole or not at all (``RequestError`` OVERLOADED, before any row is sent); a peer, or a
gateway, with nothing in flight always passes its check.  ``give`` returns a row's place when its answer
(or its timeout) comes.  Why, and what it means behind a proxy: docs/oip.md ("Sharing").
"""
from __future__ import annotations

from aieng.wire import protocol as p


def gateway_share(max_inflight: int, per_client: int, gateways: int) -> int:
    """Rows one gateway may hold in flight at the frontend."""
    return max(1, min(per_client, max_inflight // (2 * max(1, gateways))))


class PeerBudget:
    def __init__(self, share: int):
        self.share = share
        self.per_peer = max(1, share // 2)
        self.total = 0
        self.held: dict[str, int] = {}

    def take(self, peer: str, rows: int) -> None:
        """Reserve ``rows`` for ``peer`` or raise OVERLOADED; the caller gives each row back once."""
        mine = self.held.get(peer, 0)
        if mine and mine + rows > self.per_peer:
            raise p.RequestError(p.OVERLOADED, f"this client has {mine} rows in flight at this gateway (the "
                                               f"limit is {self.per_peer}); wait for answers first")
        if self.total and self.total + rows > self.share:
            raise p.RequestError(p.OVERLOADED, f"this gateway has {self.total} rows in flight (its share is "
                                               f"{self.share}); try again later")
        self.held[peer] = mine + rows
        self.total += rows

    def give(self, peer: str, rows: int = 1) -> None:
        left = self.held.get(peer, 0) - rows
        if left > 0:
            self.held[peer] = left
        else:
            self.held.pop(peer, None)
        self.total = max(0, self.total - rows)
