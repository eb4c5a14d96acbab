"""A labelled Prometheus histogram kept compactly: one list of bucket counts per series.

prometheus_client's ``Histogram`` gives every labelled child an object of its own, and every bucket of it a
value object with its own lock: about 5 KiB per series, and a model version that has answered holds twelve
series (latency, nine stages, batch size, confidence), about 60 KiB per model in a repository of a hundred.
``Histograms`` keeps a series as a ``Series`` (a list of counts per bucket, a sum, its creation time) and
renders exactly the samples prometheus_client renders for the same observations (``_bucket`` cumulative with
``le`` as Go formats it, ``_count``, ``_sum``, ``_created``), in the order the series were first labelled.
One lock per family guards the counts (``observe`` may come from any thread); a scrape copies under it.
"""
from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as _client_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString


class Series:
    """One labelled series: ``observe`` counts a value into its bucket (the first bound at or above it;
    NaN into none, as prometheus_client does) and adds it to the sum."""

    __slots__ = ("_family", "counts", "sum", "created")

    def __init__(self, family: "Histograms"):
        self._family = family
        self.counts = [0] * len(family.bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        f = self._family
        i = bisect_left(f.bounds, amount)
        with f.lock:
            if i < len(f.bounds) and amount <= f.bounds[i]:
                self.counts[i] += 1
            self.sum += amount


class Histograms:
    """A histogram family with labels, registered in ``registry`` as a collector; ``labels(*values)`` is
    its series for those label values (made on first use)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry):
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.bounds = tuple(bounds)
        self._le = tuple(floatToGoString(b) for b in bounds)
        self.lock = threading.Lock()
        self._series: dict[tuple[str, ...], Series] = {}
        registry.register(self)

    def labels(self, *values: str) -> Series:
        key = tuple(str(v) for v in values)
        s = self._series.get(key)
        if s is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values, not {len(key)}")
            with self.lock:
                s = self._series.setdefault(key, Series(self))
        return s

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, "histogram")]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "histogram")
        # whether prometheus_client shows ``_created`` (PROMETHEUS_DISABLE_CREATED_SERIES): as its own do
        created = getattr(_client_metrics, "_use_created", True)
        with self.lock:
            rows = [(key, list(s.counts), s.sum, s.created) for key, s in self._series.items()]
        for key, counts, total, born in rows:
            labels = dict(zip(self.labelnames, key))
            acc = 0.0
            for le, n in zip(self._le, counts):
                acc += n
                metric.add_sample(self.name + "_bucket", {**labels, "le": le}, acc)
            metric.add_sample(self.name + "_count", labels, acc)
            if self.bounds[0] >= 0:
                metric.add_sample(self.name + "_sum", labels, total)
            if created:
                metric.add_sample(self.name + "_created", labels, born)
        return [metric]
