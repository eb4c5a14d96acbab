"""Per-request stage timings, kept by the frontend for the timing report.

The frontend stamps every hand-off of a request, and the workers report
their own compute times, so each answered request yields one row of stage
durations (microseconds) that add up to its total:

    frontend_in        receipt -> dispatched to a preprocess worker (parse, validate, route)
    preprocess_queue   waiting for / travelling to and from the preprocess worker
    preprocess         tokenize / decode / featurise, write into shared memory
    handoff            FE -> executor -> FE transport, batch assembly, output write
    batch_wait         in the executor's queue until its batch started
    inference          the ONNX Runtime run of its batch
    postprocess_queue  waiting for / travelling to and from the postprocess worker
    postprocess        pooling / softmax / labels, packing the answer
    frontend_out       building and sending the response

Rows live in a bounded window per model (oldest dropped first); ``summary``
gives p50/p95/p99/mean and each stage's share of the total, the batch-size
distribution and the padding waste over a chosen time window.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

STAGES = ("frontend_in", "preprocess_queue", "preprocess", "handoff", "batch_wait", "inference",
          "postprocess_queue", "postprocess", "frontend_out")
WINDOW = 50_000


class StageStats:
    def __init__(self, window: int = WINDOW):
        self.window = window
        self.rows: dict[str, deque] = {}
        self.since = time.time()

    def add(self, model: str, stages: dict[str, int], batch: int, seq_len: int, padded: int) -> None:
        rows = self.rows.get(model)
        if rows is None:
            rows = self.rows[model] = deque(maxlen=self.window)
        rows.append((time.time(), [stages.get(s, 0) for s in STAGES], batch, seq_len, padded))

    def reset(self) -> None:
        self.rows.clear()
        self.since = time.time()

    def summary(self, since_s: float | None = None) -> dict[str, Any]:
        cut = time.time() - since_s if since_s else 0.0
        out: dict[str, Any] = {"stages": list(STAGES), "window_start": self.since, "models": {}}
        for model, rows in self.rows.items():
            sel = [r for r in rows if r[0] >= cut]
            if not sel:
                continue
            mat = np.asarray([r[1] for r in sel], dtype=np.float64)
            total = mat.sum(axis=1)
            grand = float(total.sum()) or 1.0
            stages = {}
            for i, name in enumerate(STAGES):
                col = mat[:, i]
                stages[name] = {"p50": float(np.percentile(col, 50)), "p95": float(np.percentile(col, 95)),
                                "p99": float(np.percentile(col, 99)), "mean": float(col.mean()),
                                "share": float(col.sum()) / grand}
            stages["total"] = {"p50": float(np.percentile(total, 50)), "p95": float(np.percentile(total, 95)),
                               "p99": float(np.percentile(total, 99)), "mean": float(total.mean()), "share": 1.0}
            batches = np.asarray([r[2] for r in sel])
            sizes, counts = np.unique(batches, return_counts=True)
            seq = np.asarray([r[3] for r in sel], dtype=np.float64)
            padded = np.asarray([r[4] for r in sel], dtype=np.float64)
            waste = 1.0 - float(seq.sum()) / float(padded.sum()) if padded.sum() > 0 else 0.0
            out["models"][model] = {
                "requests": len(sel), "seconds": max(1e-9, sel[-1][0] - sel[0][0]), "stages_us": stages,
                "batch_sizes": {int(s): int(c) for s, c in zip(sizes, counts)},
                "mean_batch": float(batches.mean()), "padding_waste": waste,
            }
        return out
