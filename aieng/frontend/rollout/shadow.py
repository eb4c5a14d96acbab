"""Shadow traffic, the pure part: comparing two answers, and the running tallies.

No sockets, no clock of its own, no frontend state; ``mirror`` does the plumbing (making the
shadow copy, pairing it with its primary) and calls in.

The setting is ``models/routing.py``'s ``ShadowConfig`` (model.yaml ``routing.shadow`` or the
``shadow_on`` admin op; ``parse_shadow`` raises ``RoutingError`` naming the field): ``version`` the
candidate, ``percent`` (0..100) of the model's requests copied, ``max_load`` (0..1, default 0.5) the
share of ``max_inflight`` above which copies are shed, ``timeout_ms`` the copy's own deadline (0: the
candidate's).  ``compare(primary, shadow)`` takes two decoded ``outputs`` maps, output by output:
a str agrees or not; a float tensor gives its cosine and max |a - b|; another tensor or number its
max |a - b|; another value (a map) is equal or a mismatch, as is a differing shape or dtype kind
or an output one side lacks.  ``Tally`` keeps, per (model, shadow version), the ``OUTCOMES``, label
agreement, cosine mean and minimum, the largest max-abs-diff, mismatched pairs and the last
``DELTAS`` latency deltas (p50/p99).  What each means to an operator: docs/rollout.md, section 8.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OUTCOMES = ("compared", "shed", "timeout", "error", "primary_failed")
DELTAS = 10_000  # latency deltas kept per (model, version): a bounded window


# -- comparing two answers ------------------------------------------------------------------
@dataclass
class Comparison:
    labels: int = 0  # str outputs compared
    agree: int = 0  # of which equal
    cosines: list[float] = field(default_factory=list)  # one per float tensor output
    max_abs_diff: float | None = None  # over every numeric output (None: there was none)
    mismatches: list[str] = field(default_factory=list)  # outputs whose kind, shape or dtype differ


def _tensor(value: Any) -> np.ndarray | None:
    if isinstance(value, dict) and {"dtype", "shape", "data"} <= set(value):
        try:
            return np.frombuffer(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
        except (TypeError, ValueError):
            return None
    items = value if isinstance(value, list) else [value]
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items):
        return np.asarray(value, dtype=np.float64)
    return None


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:  # a zero vector: similar only to another zero vector
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def compare(primary: dict, shadow: dict) -> Comparison:
    out = Comparison()
    for name in sorted(set(primary) | set(shadow)):
        if name not in primary or name not in shadow:
            out.mismatches.append(name)
            continue
        a, b = primary[name], shadow[name]
        if isinstance(a, str) or isinstance(b, str):
            if not (isinstance(a, str) and isinstance(b, str)):
                out.mismatches.append(name)
                continue
            out.labels += 1
            out.agree += a == b
            continue
        ta, tb = _tensor(a), _tensor(b)
        if ta is None or tb is None:  # other values (maps of top-k, ...): equal or a mismatch
            if a != b:
                out.mismatches.append(name)
            continue
        if ta.shape != tb.shape or ta.dtype.kind != tb.dtype.kind:
            out.mismatches.append(name)
            continue
        if ta.size:
            diff = float(np.max(np.abs(ta.astype(np.float64) - tb.astype(np.float64))))
            out.max_abs_diff = diff if out.max_abs_diff is None else max(out.max_abs_diff, diff)
        if ta.dtype.kind == "f" and ta.ndim >= 1 and ta.size:
            out.cosines.append(cosine(ta, tb))
    return out


# -- running tallies ------------------------------------------------------------------------
class Tally:
    """What one (model, shadow version) has seen since the last reset."""

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.labels = self.agree = 0
        self.cos_n, self.cos_sum, self.cos_min = 0, 0.0, math.inf
        self.max_abs_diff: float | None = None
        self.mismatches = 0
        self.deltas: deque[float] = deque(maxlen=DELTAS)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def add(self, c: Comparison, delta_s: float) -> None:
        self.outcomes["compared"] += 1
        self.labels += c.labels
        self.agree += c.agree
        for x in c.cosines:
            self.cos_n += 1
            self.cos_sum += x
            self.cos_min = min(self.cos_min, x)
        if c.max_abs_diff is not None:
            self.max_abs_diff = c.max_abs_diff if self.max_abs_diff is None else max(self.max_abs_diff,
                                                                                      c.max_abs_diff)
        self.mismatches += bool(c.mismatches)
        self.deltas.append(delta_s)

    def view(self) -> dict:
        p50 = p99 = None
        if self.deltas:
            p50, p99 = (float(x) for x in np.percentile(np.fromiter(self.deltas, float), (50, 99)))
        return {"pairs": self.outcomes["compared"], "outcomes": dict(self.outcomes),
                "shed": self.outcomes["shed"],
                "label_pairs": self.labels, "agreement": self.agree / self.labels if self.labels else None,
                "cosine_mean": self.cos_sum / self.cos_n if self.cos_n else None,
                "cosine_min": self.cos_min if self.cos_n else None,
                "max_abs_diff": self.max_abs_diff, "mismatched_pairs": self.mismatches,
                "latency_delta_p50_s": p50, "latency_delta_p99_s": p99}
