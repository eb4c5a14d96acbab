"""Per-client fairness on the client socket: message rates and replies nobody reads.

Token buckets (one second of burst):
  * every message of one client, any op, when ``client_rate_limit`` > 0;
  * all non-infer ops together (``max_ops_per_s``): health, models and stats
    are cheap but not free, and a flood of them must not starve inference.
A message over a limit is answered OVERLOADED at once (a small reply).

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
        self.client_rate = client_rate
        self.ops = Bucket(ops_rate, 0.0)
        self.buckets: OrderedDict[bytes, Bucket] = OrderedDict()
        self.dropped = {"full": 0, "gone": 0}  # replies dropped: client not reading / disconnected
        self.limited = {"client_rate": 0, "ops_rate": 0}  # messages refused OVERLOADED

    def allow(self, client: bytes, is_infer: bool, now: float) -> str | None:
        """None when the message may proceed; else why it is refused."""
        if self.client_rate > 0:
            b = self.buckets.get(client)
            if b is None:
                b = self.buckets[client] = Bucket(self.client_rate, now)
                if len(self.buckets) > MAX_TRACKED:
                    self.buckets.popitem(last=False)
            else:
                self.buckets.move_to_end(client)
            if not b.take(now):
                self.limited["client_rate"] += 1
                return f"over this client's rate limit of {self.client_rate:g} messages/s"
        if not is_infer and not self.ops.take(now):
            self.limited["ops_rate"] += 1
            return f"over the limit of {self.ops.rate:g} health/models/stats messages/s"
        return None

    def view(self) -> dict:
        return {"replies_dropped": dict(self.dropped), "refused": dict(self.limited)}
