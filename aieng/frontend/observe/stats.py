"""Per-request stage timings, kept by the frontend for the ``stats`` op (fields: docs/protocol.md).

Each answered request's ``Trail`` (one monotonic clock for every process) yields a row of stage
durations (us; ``total`` is their sum) in a bounded window per model (``WINDOW``, oldest out first; it
grows to that size as rows arrive):
``frontend_in`` (parse, validate, route, any wait for a worker), ``preprocess_queue``, ``preprocess``
(tokenize / decode / featurise, write into shared memory), ``handoff`` (preprocess -> executor),
``batch_wait`` (batch assembly included), ``inference`` (the run of its batch), ``postprocess_queue``
(output write, travel to the postprocess worker and back), ``postprocess`` and ``frontend_out``
(building and sending the response, after ``total`` is stamped); docs/protocol.md defines each.
``add_steps`` keeps each postprocess step's runs apart (failed requests' too: ``skipped``/``timeout``;
a pipeline's steps likewise): they break ``postprocess`` down and do not add to the total.
``add_failure`` counts the admitted requests answered with an error, per model and version, and their
time from receipt to the error (ns): counters since the start or the last ``reset``, not the window.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

STAGES = ("frontend_in", "preprocess_queue", "preprocess", "handoff", "batch_wait", "inference",
          "postprocess_queue", "postprocess", "frontend_out")
WINDOW = 20_000


def _us(seconds: float) -> int:
    return max(0, int(seconds * 1e6))


def stage_times(req: Any, t: Any, now: float) -> dict[str, int]:
    """An answered request's stages from the frontend's stamps (the table's ``Request``: ``received``,
    ``dispatched``) and its ``Trail``'s clock readings; all are CLOCK_MONOTONIC, so they add up to
    ``total`` but for rounding."""
    batch_end = t.batch_started + t.infer_us / 1e6
    to_post, to_frontend = _us(t.post_started - batch_end), _us(now - t.post_started - t.post_us / 1e6)
    return {"frontend_in": _us(req.dispatched - req.received),
            "preprocess_queue": _us(t.pre_started - req.dispatched),
            "preprocess": _us(t.pre_sent - t.pre_started), "handoff": _us(t.exec_arrived - t.pre_sent),
            "batch_wait": _us(t.batch_started - t.exec_arrived), "inference": t.infer_us,
            "postprocess_queue": to_post + to_frontend, "postprocess": t.post_us,
            # postprocess_queue's two hand-offs, apart (a breakdown, not more stages of the total)
            "hop.to_postprocess": to_post, "hop.to_frontend": to_frontend, "total": _us(now - req.received)}


# a window's first allocation: one row (a model of a hundred small ones that answers once holds that, with
# its arrays' headers, not 8 rows: ~0.7 KiB less each); it doubles as rows arrive, up to its full size
FIRST_ROWS = 1


def _grown(a: np.ndarray, window: int) -> np.ndarray:
    """``a`` with twice its rows (at most ``window``), the new ones zero."""
    out = np.zeros((min(window, 2 * len(a)),) + a.shape[1:], dtype=a.dtype)
    out[:len(a)] = a
    return out


class _Ring:
    """A window of rows (numpy) that grows by doubling to ``window`` rows, then wraps (oldest out first).
    Not preallocated in full: a full window is 2 MB, and a model that answers a few requests (one of a
    hundred small ones) would hold it all (the allocator may zero a reused heap block: every page touched).
    """

    def __init__(self, window: int):
        self.window = window
        rows = min(window, FIRST_ROWS)
        self.t = np.zeros(rows, dtype=np.float64)
        self.stages = np.zeros((rows, len(STAGES)), dtype=np.int64)
        self.meta = np.zeros((rows, 3), dtype=np.int64)  # batch, seq_len, padded
        self.n = 0  # rows ever added

    def add(self, t: float, stages: list[int], meta: tuple[int, int, int]) -> None:
        if self.n == len(self.t) < self.window:  # full before the first wrap: grow (order is kept)
            self.t, self.stages, self.meta = (_grown(a, self.window)
                                              for a in (self.t, self.stages, self.meta))
        i = self.n % len(self.t)
        self.t[i] = t
        self.stages[i] = stages
        self.meta[i] = meta
        self.n += 1

    def rows(self, cut: float):
        k = min(self.n, len(self.t))
        sel = self.t[:k] >= cut
        return self.t[:k][sel], self.stages[:k][sel], self.meta[:k][sel]


OUTCOMES = ("ok", "skipped", "timeout")
STEP_WINDOW = 4096


class _StepRing:
    """A window of one step's runs: time, microseconds, outcome (an index into ``OUTCOMES``)."""

    def __init__(self, window: int):
        self.window = window
        self.t = np.zeros(min(window, FIRST_ROWS), dtype=np.float64)
        self.row = np.zeros((len(self.t), 2), dtype=np.int64)
        self.n = 0

    def add(self, t: float, us: int, outcome: str) -> None:
        if self.n == len(self.t) < self.window:  # grows as _Ring does
            self.t, self.row = _grown(self.t, self.window), _grown(self.row, self.window)
        i = self.n % len(self.t)
        self.t[i] = t
        self.row[i] = (us, OUTCOMES.index(outcome) if outcome in OUTCOMES else 0)
        self.n += 1

    def summary(self, cut: float) -> dict[str, Any] | None:
        k = min(self.n, len(self.t))
        rows = self.row[:k][self.t[:k] >= cut]
        if len(rows) == 0:
            return None
        us = rows[:, 0].astype(np.float64)
        p50, p95 = np.percentile(us, (50, 95))
        counts = {name: int((rows[:, 1] == i).sum()) for i, name in enumerate(OUTCOMES)}
        return {"runs": int(len(rows)), "p50": float(p50), "p95": float(p95), "mean": float(us.mean()),
                "skipped": counts["skipped"], "timeout": counts["timeout"]}


class StageStats:
    def __init__(self, window: int = WINDOW):
        self.window = window
        self.rings: dict[str, _Ring] = {}
        self.steps: dict[str, dict[str, _StepRing]] = {}  # model -> step name -> its runs
        self.failures: dict[tuple[str, str], list[int]] = {}  # (model, version) -> [count, ns]
        self.since = time.time()

    def add_failure(self, model: str, version: str, ns: int) -> None:
        """An admitted request of ``model``/``version`` answered with an error ``ns`` after its receipt
        (the keys are served versions: bounded)."""
        row = self.failures.get((model, version))
        if row is None:
            row = self.failures[(model, version)] = [0, 0]
        row[0] += 1
        row[1] += max(0, int(ns))

    def add_steps(self, model: str, steps: list) -> None:
        """``[name, us, outcome]`` per postprocess step of one request (answered or failed)."""
        now = time.time()
        per_model = self.steps.setdefault(model, {})
        for name, us, outcome in steps:
            ring = per_model.get(name)
            if ring is None:
                if len(per_model) >= 64:  # a chain has at most 32 steps; never grow without bound
                    continue
                ring = per_model[name] = _StepRing(STEP_WINDOW)
            ring.add(now, int(us), outcome)

    def add(self, model: str, stages: dict[str, int], batch: int, seq_len: int, padded: int) -> None:
        ring = self.rings.get(model)
        if ring is None:
            ring = self.rings[model] = _Ring(self.window)
        ring.add(time.time(), [stages.get(s, 0) for s in STAGES], (batch, seq_len, padded))

    def reset(self) -> None:
        self.rings.clear()
        self.steps.clear()
        self.failures.clear()
        self.since = time.time()

    def summary(self, since_s: float | None = None) -> dict[str, Any]:
        cut = time.time() - since_s if since_s else 0.0
        out: dict[str, Any] = {"stages": list(STAGES), "window_start": self.since, "models": {},
                               "failures": {}}
        for (model, version), (count, ns) in self.failures.items():
            out["failures"].setdefault(model, {})[version] = {"count": count, "ns": ns}
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
        for model, per_step in self.steps.items():
            steps = {name: ring.summary(cut) for name, ring in per_step.items()}
            steps = {name: v for name, v in steps.items() if v is not None}
            if steps and model in out["models"]:
                out["models"][model]["steps_us"] = steps
            elif steps:  # every request of the window failed at a step: still show where
                out["models"][model] = {"requests": 0, "steps_us": steps}
        return out
