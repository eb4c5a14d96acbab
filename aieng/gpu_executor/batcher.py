"""Length-aware dynamic batching, pure logic (no sockets, no sessions).

Per model version a queue of pending requests, each with its sequence length (0 for fixed shapes).
``next_batch`` picks what to run now:
* The oldest pending request anchors the next batch of its model, so no length starves.
* The batch grows with the requests nearest in length to the anchor within ``max_padding_waste`` and
  ``max_batch_size`` (only those of the anchor's shapes, ``Pending.shape``, for a model whose tensors may
  not be padded); it runs the smallest count whose measured cost per row is within 5% of the
  cheapest (``best_rows``), a batch's fixed cost outside its run counted in (``batch_cost``: a
  version answered by the postprocess pool pays a hand-off per batch).
* It runs when full, when nothing more is on its way (``upstream``), when the anchor has waited
  ``max_wait_ms``, or when waiting is not expected to pay (``cost`` learned online, ``CostModel``).
* Among models with a runnable batch, the oldest anchor goes; the last free lane goes only to a model
  no shorter-running recent model waits behind (``crowded``).
* While every serving lane is busy, a model whose batches run at most ``1 / SPARE_RATIO`` of the shortest
  running model's may take the executor's spare lane (``spare_models``): a rarely asked fast model does not
  wait out a flooded slow model's batch (the ``crowded`` window has long closed for it).
Expired requests are removed (and returned) before a batch is formed.  The rule in full, with its
formulas and measurements: docs/architecture.md, 'Batching'.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _bucket(length: int) -> int:
    """Length bucket: the next power of two (0 stays 0 for fixed-shape models)."""
    return 0 if length <= 0 else 1 << (int(length) - 1).bit_length()


class CostModel:
    """Run time by (rows, length bucket), an exponential moving average of measured runs."""

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self.table: dict[tuple[int, int], float] = {}

    def observe(self, rows: int, length: int, seconds: float) -> None:
        key = (rows, _bucket(length))
        old = self.table.get(key)
        self.table[key] = seconds if old is None else old + self.alpha * (seconds - old)

    def estimate(self, rows: int, length: int) -> float | None:
        """Measured, or interpolated in rows within the bucket (linear), else None."""
        b = _bucket(length)
        if (rows, b) in self.table:
            return self.table[(rows, b)]
        known = sorted((r, t) for (r, bb), t in self.table.items() if bb == b)
        if not known:
            buckets = {bb for (_, bb) in self.table}
            if not buckets or b == 0:
                return None
            near = min(buckets, key=lambda bb: abs(bb - b))  # scale the nearest bucket by length
            est = self.estimate(rows, near)
            return None if est is None or near == 0 else est * b / near
        if len(known) == 1:
            r0, t0 = known[0]
            return t0 * rows / r0
        lo = max((k for k in known if k[0] <= rows), default=known[0], key=lambda k: k[0])
        hi = min((k for k in known if k[0] >= rows), default=known[-1], key=lambda k: k[0])
        if lo[0] == hi[0]:
            lo, hi = known[-2], known[-1]
        slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
        return max(0.0, lo[1] + slope * (rows - lo[0]))

    def snapshot(self) -> dict[str, float]:
        return {f"{r}x{b}": round(t * 1000, 3) for (r, b), t in sorted(self.table.items())}


@dataclass
class Pending:
    rid: int
    seq_len: int
    arrived: float
    deadline: float
    payload: Any = None
    shape: Any = None  # its tensors' shapes where the model batches only equal shapes (no padding), else None


@dataclass
class ModelQueue:
    max_batch_size: int
    max_wait_s: float
    max_padding_waste: float
    items: list[Pending] = field(default_factory=list)
    upstream: int = 0
    cost: CostModel = field(default_factory=CostModel)
    gap: float | None = None  # EMA of seconds between arrivals
    last_arrival: float | None = None
    capped: bool = False
    run_s: float | None = None  # EMA of a batch's measured run, whatever its rows (``crowded``)
    fixed_s: float = 0.0  # what each batch costs besides its run (``batch_cost``)


def padding_waste(lengths: list[int]) -> float:
    if not lengths:
        return 0.0
    top = max(lengths)
    if top == 0:
        return 0.0
    return 1.0 - sum(lengths) / (len(lengths) * top)


SHARE_WINDOW_S = 2.0  # a model with a request this recent keeps a lane open to it (``crowded``)
SPARE_RATIO = 4.0  # the spare lane only for a model this many times faster than every running one


class Batcher:
    def __init__(self) -> None:
        self.queues: dict[str, ModelQueue] = {}

    def add_model(self, key: str, max_batch_size: int, max_wait_ms: float, max_padding_waste: float) -> None:
        self.queues[key] = ModelQueue(max_batch_size, max_wait_ms / 1000.0, max_padding_waste)

    def batch_cost(self, key: str, seconds: float) -> None:
        """Each of ``key``'s batches costs ``seconds`` besides its run (``best_rows`` counts it per row)."""
        self.queues[key].fixed_s = seconds

    def put(self, key: str, item: Pending, upstream: int) -> None:
        q = self.queues[key]
        if q.last_arrival is not None:
            gap = max(0.0, item.arrived - q.last_arrival)
            q.gap = gap if q.gap is None else q.gap + 0.2 * (gap - q.gap)
        q.last_arrival = item.arrived
        q.items.append(item)
        q.upstream = upstream

    def observe(self, key: str, rows: int, length: int, seconds: float) -> None:
        q = self.queues.get(key)
        if q is not None:  # a run that ends after its version was unloaded teaches nothing
            q.cost.observe(rows, length, seconds)
            q.run_s = seconds if q.run_s is None else q.run_s + 0.2 * (seconds - q.run_s)

    @staticmethod
    def worth_waiting(q: ModelQueue, batch: list[Pending]) -> bool:
        """Does waiting for the requests on their way finish everything sooner?"""
        if q.upstream <= 0:
            return False
        if q.gap is None:
            return True  # no arrival rate known yet: the max_wait bound decides
        b = len(batch)
        u = min(q.upstream, q.max_batch_size - b)
        if u <= 0:
            return False
        length = max(p.seq_len for p in batch)
        now_b, now_u, together = (q.cost.estimate(b, length), q.cost.estimate(u, length),
                                  q.cost.estimate(b + u, length))
        if now_b is None or now_u is None or together is None:
            return True  # nothing measured yet: fall back to the max_wait bound
        return u * q.gap + together < now_b + now_u

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
        q.capped = False
        if q.max_batch_size == 1 or len(q.items) == 1:
            return [anchor]
        rest = sorted(q.items[1:], key=lambda p: (abs(p.seq_len - anchor.seq_len), p.arrived))
        chosen = [anchor]
        lengths = [anchor.seq_len]
        for p in rest:
            if len(chosen) >= q.max_batch_size:
                break
            if p.shape != anchor.shape:  # a model that may not be padded batches equal shapes only
                continue
            trial = lengths + [p.seq_len]
            if padding_waste(trial) <= q.max_padding_waste:
                chosen.append(p)
                lengths = trial
        n = Batcher.best_rows(q, lengths)
        q.capped = n < len(chosen)  # the best size is reached: growing it would not help
        return chosen[:n]

    @staticmethod
    def best_rows(q: ModelQueue, lengths: list[int]) -> int:
        """How many of the chosen (nearest-length first) to run: a bigger batch only when it pays,
        i.e. the smallest count whose measured cost per row (its run and the batch's ``fixed_s``) is
        within 5% of the cheapest count's.

        On a GPU a bigger batch is nearly free, so it grows; on this CPU the cost per row is flat
        from a few rows and rises at long lengths (measured: 7.9 ms/row at 8 x 32 tokens, 7.8 at
        32 x 32, 17.5 at 1 x 64, 19.3 at 32 x 64), so a big batch only adds padding and latency.
        """
        n_all = len(lengths)
        if n_all <= 1 or not q.cost.table:
            return n_all
        per_row = {}
        longest = 0
        for n in range(1, n_all + 1):
            longest = max(longest, lengths[n - 1])
            est = q.cost.estimate(n, longest)
            if est is not None:
                per_row[n] = (est + q.fixed_s) / n
        if not per_row:
            return n_all
        cheapest = min(per_row.values())
        return min(n for n, cost in per_row.items() if cost <= cheapest / 0.95)

    def crowded(self, now: float, running: dict[str, int], lanes: int) -> set[str]:
        """Models that may not take the last free one of ``lanes`` now, given the lanes each runs (module
        doc): those with a model whose batches run shorter, or are not measured yet, recently active."""
        if lanes < 2 or lanes - sum(running.values()) != 1:
            return set()
        recent = {k: q.run_s or 0.0 for k, q in self.queues.items()
                  if q.last_arrival is not None and now - q.last_arrival <= SHARE_WINDOW_S}
        return {k for k, q in self.queues.items() if q.run_s is not None
                and any(r < q.run_s for other, r in recent.items() if other != k)}

    def spare_models(self, running: dict[str, int]) -> set[str]:
        """Models that may take the spare lane while ``running`` holds every serving lane: measured, not
        running now, with items, and at most ``1 / SPARE_RATIO`` of the shortest running model's run.  A
        model not measured yet, or lanes held by one, give none: its run could be long, and the spare lane
        runs beside full lanes (one more thread than cores, so it must be short to cost them little)."""
        held = [self.queues[k].run_s if k in self.queues else None for k in running]
        if not held or any(r is None for r in held):
            return set()
        shortest = min(held)
        return {k for k, q in self.queues.items() if q.items and k not in running and q.run_s is not None
                and q.run_s * SPARE_RATIO <= shortest}

    def next_batch(self, now: float, running: dict[str, int] | None = None, lanes: int = 0,
                   only: set[str] | None = None) -> tuple[str | None, list[Pending], float | None]:
        """``(model key, batch, None)`` to run now, or ``(None, [], wake_at)``.  ``running``/``lanes``: the
        serving lanes in use per model and their number, for sharing them (``crowded``); ``only``: the
        models that may run (the spare lane's, ``spare_models``)."""
        best_key, best_batch, best_age = None, [], None
        wake_at = None
        skip = self.crowded(now, running or {}, lanes)
        for key, q in self.queues.items():
            if not q.items or key in skip or (only is not None and key not in only):
                continue
            batch = self.select(q)
            anchor = q.items[0]
            due = anchor.arrived + q.max_wait_s
            full = len(batch) >= q.max_batch_size or q.capped
            if full or now >= due or len(q.items) >= q.max_batch_size or not self.worth_waiting(q, batch):
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
