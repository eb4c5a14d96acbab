"""One feature's reference population and its recent window, and how a reference is built from a sample.

A reference is, per feature, either numeric bin ``edges`` (sorted, ``len(edges) + 1`` bins: value v
falls in bin ``bisect_right(edges, v)``) or ``categories`` (the last bin is "anything else"), and the
reference ``proportions`` of each bin (they sum to 1).  ``build(values)`` makes one from a sample:
numeric edges at the sample's deciles, halfway to the next value it holds (duplicates dropped: a
feature with few distinct values gets fewer bins), and one just below its smallest and one just above
its largest value (a value beyond the sample falls in a bin whose reference share is 0); categories:
the most frequent values seen.  ``Binned`` keeps the last ``window`` bin indices and scores them with
the population stability index

    PSI = sum_i (a_i - e_i) * ln(a_i / e_i)

a the window's shares, e the reference's, both floored at 1e-4; no score before ``MIN_OBSERVATIONS``
values.  Only bin indices are kept, never the values themselves.  ``problem(ref)`` says what is wrong
with a reference read back from a file (None: ``Binned`` can take it), ``features_problem`` with a map of
them.  Pure: no files, no clocks.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter, deque

import numpy as np

MIN_OBSERVATIONS = 50
FLOOR = 1e-4
BINS = 10
MAX_CATEGORIES = 20


def numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def build(values: list) -> dict | None:
    """A reference (``edges`` or ``categories``, and ``proportions``) from a sample; None when the
    sample holds no usable value."""
    nums = [float(v) for v in values if numeric(v)]
    cats = [v for v in values if isinstance(v, str)]
    if len(cats) > len(nums):
        common = [c for c, _ in Counter(cats).most_common(MAX_CATEGORIES)]
        categories = sorted(common)
        index = {c: i for i, c in enumerate(categories)}
        counts = [0] * (len(categories) + 1)
        for c in cats:
            counts[index.get(c, len(categories))] += 1
        return {"categories": categories, "proportions": [n / len(cats) for n in counts]}
    if not nums:
        return None
    distinct = sorted(set(nums))
    lo, hi = distinct[0], distinct[-1]
    # Each decile's edge lies halfway to the next distinct value, so the same input computed again a few
    # ulps apart (another batch's padding) stays in its bin; one more edge just below the smallest and
    # one just above the largest value give what the sample never held bins of their own (else a feature
    # that was always 0 would put 0.8 in the same bin as 0, and no shift would show).
    edges = {lo - margin(lo), hi + margin(hi)}
    for q in np.quantile(np.asarray(nums), [i / BINS for i in range(1, BINS)], method="lower"):
        j = bisect.bisect_left(distinct, float(q))
        if j + 1 < len(distinct):
            edges.add((distinct[j] + distinct[j + 1]) / 2)
    edges = sorted(edges)
    counts = [0] * (len(edges) + 1)
    for v in nums:
        counts[bisect.bisect_right(edges, v)] += 1
    return {"edges": edges, "proportions": [n / len(nums) for n in counts]}


MAX_BINS = 1000  # more than build() ever makes (BINS + 2 edges, MAX_CATEGORIES + 1 categories)


def problem(ref) -> str | None:
    """Why ``ref`` (read back from a file) is not a reference ``Binned`` can score against; None if it is."""
    if not isinstance(ref, dict):
        return "not a map"
    props = ref.get("proportions")
    if not isinstance(props, list) or not 1 <= len(props) <= MAX_BINS or not all(numeric(p) and p >= 0
                                                                                   for p in props):
        return "proportions must be a list of non-negative numbers"
    edges, cats = ref.get("edges"), ref.get("categories")
    if (edges is None) == (cats is None):
        return "needs edges or categories, not both"
    bounds = edges if edges is not None else cats
    if not isinstance(bounds, list) or len(bounds) + 1 != len(props):
        return "needs one bin more than its edges or categories"
    if edges is not None and (not all(numeric(e) for e in edges) or edges != sorted(edges)):
        return "edges must be sorted numbers"
    if cats is not None and not all(isinstance(c, str) for c in cats):
        return "categories must be strings"
    return None


def features_problem(features, where: str = "") -> str | None:
    """Why a map of feature name -> reference (read back from a file) cannot be used; None if it can."""
    if not isinstance(features, dict):
        return f"{where or 'features'} must be a map"
    for name, ref in features.items():
        why = problem(ref)
        if why is not None:
            return f"{where}.{name}: {why}" if where else f"feature {name!r}: {why}"
    return None


def margin(v: float) -> float:
    return max(abs(v), 1.0) * 1e-3


def psi(actual: list[float], expected: list[float]) -> float:
    total = 0.0
    for a, e in zip(actual, expected):
        a, e = max(FLOOR, a), max(FLOOR, e)
        total += (a - e) * math.log(a / e)
    return total


class Binned:
    """A feature's reference and its last ``window`` observations, as bin indices."""

    def __init__(self, ref: dict, window: int):
        self.ref = ref
        self.edges = ref.get("edges")
        self.index = {c: i for i, c in enumerate(ref.get("categories") or [])}
        self.expected = [float(p) for p in ref["proportions"]]
        self.recent: deque[int] = deque(maxlen=window)
        self.counts = [0] * len(self.expected)  # of ``recent`` per bin, kept as it moves: psi() is O(bins)

    def add(self, b: int) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.counts[self.recent[0]] -= 1
        self.recent.append(b)
        self.counts[b] += 1

    def observe(self, value) -> None:
        if value is None or isinstance(value, bool):
            return
        if self.edges is not None:
            if numeric(value):
                self.add(bisect.bisect_right(self.edges, value))
        elif isinstance(value, str):
            self.add(self.index.get(value, len(self.expected) - 1))

    def psi(self) -> float | None:
        n = len(self.recent)
        if n < MIN_OBSERVATIONS:
            return None
        return psi([c / n for c in self.counts], self.expected)
