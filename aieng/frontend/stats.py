"""Per-request stage timings, kept by the frontend for the timing report.

The frontend stamps a request's receipt, its dispatch and its answer, and
the request's ``Trail`` brings back each worker's clock readings (one
monotonic clock for every process), so each answered request yields one row
of stage durations (microseconds) that add up to its total:

    frontend_in        receipt -> sent to a preprocess worker (parse, validate, route; any wait for a worker)
    preprocess_queue   travelling to the preprocess worker and waiting there
    preprocess         tokenize / decode / featurise, write into shared memory
    handoff            preprocess worker -> executor transport
    batch_wait         in the executor's queue until its batch started (batch assembly included)
    inference          the ONNX Runtime run of its batch
    postprocess_queue  output write, travel to the postprocess worker, waiting there, and the answer's way
                       back to the frontend
    postprocess        pooling / softmax / labels, packing the answer
    frontend_out       building and sending the response (after ``total`` is stamped)

Rows live in a bounded window per model (oldest dropped first); ``summary``
gives p50/p95/p99/mean and each stage's share of the total, the batch-size
distribution and the padding waste over a chosen time window.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

STAGES = ("frontend_in", "preprocess_queue", "preprocess", "handoff", "batch_wait", "inference",
          "postprocess_queue", "postprocess", "frontend_out")
WINDOW = 20_000


class _Ring:
    """A preallocated window of rows (numpy), so memory is flat from the first request."""

    def __init__(self, window: int):
        self.t = np.zeros(window, dtype=np.float64)
        self.stages = np.zeros((window, len(STAGES)), dtype=np.int64)
        self.meta = np.zeros((window, 3), dtype=np.int64)  # batch, seq_len, padded
        self.n = 0  # rows ever added

    def add(self, t: float, stages: list[int], meta: tuple[int, int, int]) -> None:
        i = self.n % len(self.t)
        self.t[i] = t
        self.stages[i] = stages
        self.meta[i] = meta
        self.n += 1

    def rows(self, cut: float):
        k = min(self.n, len(self.t))
        sel = self.t[:k] >= cut
        return self.t[:k][sel], self.stages[:k][sel], self.meta[:k][sel]


class StageStats:
    def __init__(self, window: int = WINDOW):
        self.window = window
        self.rings: dict[str, _Ring] = {}
        self.since = time.time()

    def add(self, model: str, stages: dict[str, int], batch: int, seq_len: int, padded: int) -> None:
        ring = self.rings.get(model)
        if ring is None:
            ring = self.rings[model] = _Ring(self.window)
        ring.add(time.time(), [stages.get(s, 0) for s in STAGES], (batch, seq_len, padded))

    def reset(self) -> None:
        self.rings.clear()
        self.since = time.time()

    def summary(self, since_s: float | None = None) -> dict[str, Any]:
        cut = time.time() - since_s if since_s else 0.0
        out: dict[str, Any] = {"stages": list(STAGES), "window_start": self.since, "models": {}}
        for model, ring in self.rings.items():
            ts, mat, meta = ring.rows(cut)
            if len(ts) == 0:
                continue
            mat = mat.astype(np.float64)
            full = np.column_stack([mat, mat.sum(axis=1)])  # the stages, then the total
            pct = np.percentile(full, (50, 95, 99), axis=0)  # one partition pass for every column
            sums = full.sum(axis=0)
            grand = float(sums[-1]) or 1.0
            stages = {}
            for i, name in enumerate(STAGES + ("total",)):
                stages[name] = {"p50": float(pct[0, i]), "p95": float(pct[1, i]), "p99": float(pct[2, i]),
                                "mean": float(sums[i]) / len(full), "share": float(sums[i]) / grand}
            batches = meta[:, 0]
            sizes, counts = np.unique(batches, return_counts=True)
            seq, padded = meta[:, 1].astype(np.float64), meta[:, 2].astype(np.float64)
            waste = 1.0 - float(seq.sum()) / float(padded.sum()) if padded.sum() > 0 else 0.0
            out["models"][model] = {
                "requests": int(len(ts)), "seconds": max(1e-9, float(ts.max() - ts.min())),
                "stages_us": stages,
                "batch_sizes": {str(int(s)): int(c) for s, c in zip(sizes, counts)},  # protocol: string keys
                "mean_batch": float(batches.mean()), "padding_waste": waste,
            }
        return out
