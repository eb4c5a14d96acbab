"""Labelled Prometheus families kept compactly: a small slotted record per series, one lock per family.

prometheus_client gives every labelled child an object of its own (a dozen attributes) and every value
in it a value object with its own lock: about 1 KiB per counter or gauge series and 5 KiB per histogram
series.  A model version that has answered holds twelve histogram series (latency, nine stages, batch
size, confidence) and a few counters and gauges, so in a repository of a hundred small models these were
most of what the frontend held per model.  ``Histograms``, ``Counters`` and ``Gauges`` keep a series as a
record (a histogram's: a list of counts per bucket, shared zeros until its first value, a sum, its creation
time) and render exactly the samples prometheus_client renders for the same calls (``_bucket`` cumulative
with ``le`` as Go formats it, ``_count``, ``_sum``, a counter's ``_total``, ``_created`` where
prometheus_client shows it), in the order the series were first labelled.  ``labels(*values)`` makes a
series on first use; ``remove`` drops one.  One lock per family guards the values (calls may come from
any thread); a scrape copies under it.
"""
from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import Any, Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as _client_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString


def _created() -> bool:
    """Whether prometheus_client shows ``_created`` series (PROMETHEUS_DISABLE_CREATED_SERIES), as its own."""
    return getattr(_client_metrics, "_use_created", True)


class _Family:
    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry):
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.lock = threading.Lock()
        self._series: dict[tuple[str, ...], Any] = {}
        registry.register(self)

    def _new(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: str) -> Any:
        key = tuple(str(v) for v in values)
        s = self._series.get(key)
        if s is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values, not {len(key)}")
            with self.lock:
                s = self._series.setdefault(key, self._new())
        return s

    def remove(self, *values: str) -> None:
        with self.lock:
            self._series.pop(tuple(str(v) for v in values), None)

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        created = _created()
        with self.lock:
            rows = [(dict(zip(self.labelnames, key)), s.state()) for key, s in self._series.items()]
        for labels, state in rows:
            self._samples(metric, labels, state, created)
        return [metric]

    def _samples(self, metric: Metric, labels: dict, state: Any, created: bool) -> None:
        raise NotImplementedError


class Series:
    """One histogram series: ``observe`` counts a value into its bucket (the first bound at or above it;
    NaN into none, as prometheus_client does) and adds it to the sum."""

    __slots__ = ("_family", "counts", "sum", "created")

    def __init__(self, family: "Histograms"):
        self._family = family
        self.counts: list[int] | tuple[int, ...] = family.zeros  # shared until a value lands in a bucket
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        f = self._family
        i = bisect_left(f.bounds, amount)
        with f.lock:
            if i < len(f.bounds) and amount <= f.bounds[i]:
                counts = self.counts
                if counts is f.zeros:  # a stage a version's requests never pass holds no list of its own
                    counts = self.counts = list(counts)
                counts[i] += 1
            self.sum += amount

    def state(self) -> tuple:
        return list(self.counts), self.sum, self.created


class Histograms(_Family):
    """A histogram family with labels."""
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry):
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self.bounds = tuple(bounds)
        self.zeros = (0,) * len(bounds)  # every series' counts until its first value
        self._le = tuple(floatToGoString(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> Series:
        return Series(self)

    def _samples(self, metric: Metric, labels: dict, state: Any, created: bool) -> None:
        counts, total, born = state
        acc = 0.0
        for le, n in zip(self._le, counts):
            acc += n
            metric.add_sample(self.name + "_bucket", {**labels, "le": le}, acc)
        metric.add_sample(self.name + "_count", labels, acc)
        if self.bounds[0] >= 0:
            metric.add_sample(self.name + "_sum", labels, total)
        if created:
            metric.add_sample(self.name + "_created", labels, born)


class Count:
    """One counter series."""

    __slots__ = ("_family", "value", "created")

    def __init__(self, family: "Counters"):
        self._family, self.value, self.created = family, 0.0, time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._family.lock:
            self.value += amount

    def state(self) -> tuple:
        return self.value, self.created


class Counters(_Family):
    """A counter family with labels (``name`` without ``_total``, as prometheus_client keeps it)."""
    kind = "counter"

    def _new(self) -> Count:
        return Count(self)

    def _samples(self, metric: Metric, labels: dict, state: Any, created: bool) -> None:
        value, born = state
        metric.add_sample(self.name + "_total", labels, value)
        if created:
            metric.add_sample(self.name + "_created", labels, born)


class Level:
    """One gauge series."""

    __slots__ = ("_family", "value")

    def __init__(self, family: "Gauges"):
        self._family, self.value = family, 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def state(self) -> float:
        return self.value


class Gauges(_Family):
    """A gauge family with labels."""
    kind = "gauge"

    def _new(self) -> Level:
        return Level(self)

    def _samples(self, metric: Metric, labels: dict, state: Any, created: bool) -> None:
        metric.add_sample(self.name, labels, state)
