"""Per-client fairness on the client socket: message rates and replies nobody reads.

Token buckets per client (its ZMQ routing identity; one second of burst):
  * every message of the client, any op, when ``client_rate_limit`` > 0;
  * its non-infer ops (``max_ops_per_s``): health, models and stats are cheap
    but not free, and one client's flood of them must not starve inference or
    anyone else's health checks.
A message over a limit is answered OVERLOADED at once (a small reply).  The
least recently seen clients' buckets are forgotten beyond ``MAX_TRACKED``.

Replies: the client ROUTER has a per-connection send queue of
``client_send_queue`` messages (ZMQ_SNDHWM) and ROUTER_MANDATORY, so a reply
to a client whose queue is full (it does not read) or who is gone raises
instead of queueing without bound; the reply is dropped and counted here.
"""
from __future__ import annotations

from collections import OrderedDict

MAX_TRACKED = 10_000  # clients with a bucket; the least recently seen go first


class Bucket:
    __slots__ = ("rate", "tokens", "at")

    def __init__(self, rate: float, now: float):
        self.rate, self.tokens, self.at = rate, rate, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class ClientGate:
    def __init__(self, client_rate: float, ops_rate: float):
        self.client_rate, self.ops_rate = client_rate, ops_rate
        self.buckets: OrderedDict[bytes, tuple[Bucket | None, Bucket]] = OrderedDict()
        self.dropped = {"full": 0, "gone": 0}  # replies dropped: client not reading / disconnected
        self.limited = {"client_rate": 0, "ops_rate": 0}  # messages refused OVERLOADED

    def allow(self, client: bytes, is_infer: bool, now: float) -> str | None:
        """None when the message may proceed; else why it is refused."""
        pair = self.buckets.get(client)
        if pair is None:
            pair = self.buckets[client] = (Bucket(self.client_rate, now) if self.client_rate > 0 else None,
                                           Bucket(self.ops_rate, now))
            if len(self.buckets) > MAX_TRACKED:
                self.buckets.popitem(last=False)
        else:
            self.buckets.move_to_end(client)
        every, ops = pair
        if every is not None and not every.take(now):
            self.limited["client_rate"] += 1
            return f"over this client's rate limit of {self.client_rate:g} messages/s"
        if not is_infer and not ops.take(now):
            self.limited["ops_rate"] += 1
            return f"over this client's limit of {self.ops_rate:g} health/models/stats messages/s"
        return None

    def view(self) -> dict:
        return {"replies_dropped": dict(self.dropped), "refused": dict(self.limited)}
