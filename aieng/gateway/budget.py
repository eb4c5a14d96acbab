"""Rows in flight per OIP peer: one client of a gateway can no longer deny the others (issue 20, finding 6).

The frontend sees a gateway as one client, so without this every OIP client of a gateway shared one
per-client budget, and the gateways together could hold all of ``AIENG_MAX_INFLIGHT``.  Each gateway now
holds at most ``gateway_share`` rows in flight: half of ``AIENG_MAX_INFLIGHT`` split between the
gateways, and never more than the frontend's per-client limit (so the frontend never refuses a row for
that).  Native clients keep the other half.  Within the share one peer (the client's IP address; every
connection from it counts together) holds at most half, so two peers always fit.

A request is admitted whole or not at all: its rows are taken together before any is sent, so a
multi-row request never leaves some rows running after others were refused.  A peer with nothing in
flight is always let through the per-peer check (a request of more rows than the per-peer half still
runs, alone).  A refusal is OVERLOADED (HTTP 503, gRPC UNAVAILABLE), like the frontend's.  Each row gives
its place back when its answer (or its timeout) comes.

Behind a proxy every client has the proxy's address and shares one peer budget: put the proxy's own
limits in front, or run gateways per tenant.
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
