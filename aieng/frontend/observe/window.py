"""The last minute of answers per model version, for the status page (``RollingWindow``).

``add(model, version, code, seconds, now)`` is called by the frontend loop for every answered request (the
``outcome`` that ``requests/answers.Answers`` reports); it is O(1): one ring slot per second of the last
``SECONDS`` (60), found by the whole second, and in it the request count, the error count and a sparse
latency histogram (answers OK only) of log-spaced bins (``BINS_PER_OCTAVE`` a doubling: a bin is about
9% wide, so a percentile read from it is within about 5% of the true one).  A slot older than the window
is reset when its second comes round again, so memory is bounded by the versions served times 60 slots
times the bins used (a few dozen).  ``view(now)`` (once per published snapshot) merges the slots of the
last minute into one ``Traffic`` per version and per model: requests, errors, requests a second, p50, p99.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

SECONDS = 60
BINS_PER_OCTAVE = 8
MIN_S = 1e-6  # latencies below a microsecond share the lowest bin


@dataclass(frozen=True)
class Traffic:
    """One model's (or version's) answers over the last ``window_s`` seconds."""
    requests: int
    errors: int
    rps: float  # requests / window_s
    p50_ms: float | None  # of the answers OK; None without one in the window
    p99_ms: float | None
    window_s: float  # the time the counted seconds cover, up to now: at most SECONDS, less at the start


class _Slot:
    __slots__ = ("second", "count", "errors", "bins")

    def __init__(self) -> None:
        self.second = -1
        self.count = 0
        self.errors = 0
        self.bins: dict[int, int] = {}


def _bin(seconds: float) -> int:
    return int(math.log2(max(seconds, MIN_S) / MIN_S) * BINS_PER_OCTAVE)


def _bin_ms(index: int) -> float:
    """The geometric middle of bin ``index``, in milliseconds."""
    return MIN_S * 2.0 ** ((index + 0.5) / BINS_PER_OCTAVE) * 1000.0


class RollingWindow:
    def __init__(self, clock_start: float) -> None:
        """``clock_start``: the monotonic time the window starts counting (its first minute is shorter)."""
        self.start = clock_start
        self.rings: dict[tuple[str, str], list[_Slot]] = {}

    def add(self, model: str, version: str, code: str, seconds: float, now: float) -> None:
        ring = self.rings.get((model, version))
        if ring is None:
            ring = self.rings[(model, version)] = [_Slot() for _ in range(SECONDS)]
        sec = int(now)
        slot = ring[sec % SECONDS]
        if slot.second != sec:  # a minute (or more) old: this second starts afresh
            slot.second, slot.count, slot.errors = sec, 0, 0
            slot.bins.clear()
        slot.count += 1
        if code != "OK":  # an error's time (a refusal is quick) would skew the answers' percentiles
            slot.errors += 1
            return
        b = _bin(seconds)
        slot.bins[b] = slot.bins.get(b, 0) + 1

    def view(self, now: float) -> dict[str, dict[str, Traffic]]:
        """``{model: {"": the model's Traffic, version: that version's}}`` over the last minute (the
        current second included); a version with nothing in the window is left out."""
        cut = int(now) - SECONDS + 1
        span = max(1.0, now - max(cut, self.start))  # the time the kept seconds cover (the current in part)
        merged: dict[str, dict[str, tuple[int, int, dict[int, int]]]] = {}
        for (model, version), ring in self.rings.items():
            count = errors = 0
            bins: dict[int, int] = {}
            for slot in ring:
                if slot.second >= cut and slot.count:
                    count += slot.count
                    errors += slot.errors
                    for b, n in slot.bins.items():
                        bins[b] = bins.get(b, 0) + n
            if count:
                merged.setdefault(model, {})[version] = (count, errors, bins)
        out: dict[str, dict[str, Traffic]] = {}
        for model, versions in merged.items():
            total_bins: dict[int, int] = {}
            for _, _, bins in versions.values():
                for b, n in bins.items():
                    total_bins[b] = total_bins.get(b, 0) + n
            rows = {v: _traffic(c, e, bins, span) for v, (c, e, bins) in versions.items()}
            rows[""] = _traffic(sum(c for c, _, _ in versions.values()),
                                sum(e for _, e, _ in versions.values()), total_bins, span)
            out[model] = rows
        return out


def _traffic(count: int, errors: int, bins: dict[int, int], span: float) -> Traffic:
    ok = count - errors
    return Traffic(count, errors, round(count / span, 3), _percentile(bins, ok, 0.50),
                   _percentile(bins, ok, 0.99), round(span, 3))


def _percentile(bins: dict[int, int], count: int, q: float) -> float | None:
    """The bin holding the ``q`` quantile (nearest rank), as its middle in ms."""
    if not count:
        return None
    rank = max(1, math.ceil(q * count))
    seen = 0
    for b in sorted(bins):
        seen += bins[b]
        if seen >= rank:
            return round(_bin_ms(b), 3)
    return None
