"""Length-aware dynamic batching, pure logic (no sockets, no sessions).

Per model version a queue of pending requests, each with its sequence length
(0 for fixed-shape models).  ``next_batch`` picks what to run now:

* The oldest pending request always anchors the next batch of its model, so a
  stream of long requests never starves a short one (and vice versa).
* The batch grows with the requests nearest in length to the anchor while the
  padding waste ``1 - sum(len) / (rows * max_len)`` stays within
  ``max_padding_waste`` and rows stay within ``max_batch_size``.
* It runs at once when full, when nothing more is known to be on its way
  (``upstream`` = requests of the model still being preprocessed when the
  last one was dispatched), or when the anchor has waited ``max_wait_ms``.
  Otherwise the caller sleeps until the earliest such deadline.
* Among models with a runnable batch, the one with the oldest anchor goes.

Expired requests are removed (and returned) before a batch is formed, so the
model never runs a request whose client has already been told TIMEOUT.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pending:
    rid: int
    seq_len: int
    arrived: float
    deadline: float
    payload: Any = None


@dataclass
class ModelQueue:
    max_batch_size: int
    max_wait_s: float
    max_padding_waste: float
    items: list[Pending] = field(default_factory=list)
    upstream: int = 0


def padding_waste(lengths: list[int]) -> float:
    if not lengths:
        return 0.0
    top = max(lengths)
    if top == 0:
        return 0.0
    return 1.0 - sum(lengths) / (len(lengths) * top)


class Batcher:
    def __init__(self) -> None:
        self.queues: dict[str, ModelQueue] = {}

    def add_model(self, key: str, max_batch_size: int, max_wait_ms: float, max_padding_waste: float) -> None:
        self.queues[key] = ModelQueue(max_batch_size, max_wait_ms / 1000.0, max_padding_waste)

    def put(self, key: str, item: Pending, upstream: int) -> None:
        q = self.queues[key]
        q.items.append(item)
        q.upstream = upstream

    def pending(self) -> int:
        return sum(len(q.items) for q in self.queues.values())

    def expire(self, now: float) -> list[Pending]:
        gone = []
        for q in self.queues.values():
            if any(p.deadline <= now for p in q.items):
                gone += [p for p in q.items if p.deadline <= now]
                q.items = [p for p in q.items if p.deadline > now]
        return gone

    @staticmethod
    def select(q: ModelQueue) -> list[Pending]:
        """The anchor (oldest) plus its nearest-length neighbours within the waste bound."""
        anchor = q.items[0]
        if q.max_batch_size == 1 or len(q.items) == 1:
            return [anchor]
        rest = sorted(q.items[1:], key=lambda p: (abs(p.seq_len - anchor.seq_len), p.arrived))
        chosen = [anchor]
        lengths = [anchor.seq_len]
        for p in rest:
            if len(chosen) >= q.max_batch_size:
                break
            trial = lengths + [p.seq_len]
            if padding_waste(trial) <= q.max_padding_waste:
                chosen.append(p)
                lengths = trial
        return chosen

    def next_batch(self, now: float) -> tuple[str | None, list[Pending], float | None]:
        """``(model key, batch, None)`` to run now, or ``(None, [], wake_at)``."""
        best_key, best_batch, best_age = None, [], None
        wake_at = None
        for key, q in self.queues.items():
            if not q.items:
                continue
            batch = self.select(q)
            anchor = q.items[0]
            due = anchor.arrived + q.max_wait_s
            full = len(batch) >= q.max_batch_size
            nothing_coming = q.upstream <= 0
            if full or nothing_coming or now >= due or len(q.items) >= q.max_batch_size:
                if best_age is None or anchor.arrived < best_age:
                    best_key, best_batch, best_age = key, batch, anchor.arrived
            else:
                wake_at = due if wake_at is None else min(wake_at, due)
        if best_key is not None:
            chosen = {id(p) for p in best_batch}
            q = self.queues[best_key]
            q.items = [p for p in q.items if id(p) not in chosen]
            return best_key, best_batch, None
        return None, [], wake_at
