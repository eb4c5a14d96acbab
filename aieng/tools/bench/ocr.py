"""``aieng bench --model ocr``: the ``ocr`` pipeline beside rapidocr's own one-process pipeline, in one run.

The same drawn page images (``bench_pages.pages``) go through:

1. rapidocr (``RapidOCR`` on the ONNX files the server serves, ``use_cls`` off as the server has no
   classifier), one page at a time in this process, as a user would run it; ONNX Runtime uses every
   core while it runs.  Its own time per step (``elapse_list``: det, rec) is reported.  rapidocr is
   imported only inside ``engine`` and only when installed (it is a test dependency); without it the
   reference rows are left out.  It runs before and after the server, so drift of a shared machine shows.
2. The aieng server (a subprocess serving ``textdet,textrec,ocr``), closed loop at each concurrency:
   pages per second, p50/p95 latency, and the mean of each step of ``timing_us`` (textdet, crop,
   textrec, join) and of the crop batch size.

Targets (issue 13): throughput at saturation >= 1.1 x rapidocr's, concurrency-1 latency within 10% of
rapidocr's.  Writes ``<out>/ocr.md``.  Speed targets live here, never in tests.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from aieng.tools.bench import pages as bench_pages

STEPS = ("textdet", "crop", "textrec", "join")
REPORT = bench_pages.Report(
    model="ocr", serve="textdet,textrec,ocr", ref_name="rapidocr",
    ref_note="one process, one page at a time, use_cls off", ref_steps=("det", "rec"), steps=STEPS,
    steps_note="step columns are means of timing_us (crop: each crop's preprocessing, summed per page)",
    batch_name="crop batch")


def engine(repo: str) -> Callable[[np.ndarray], dict[str, float]] | None:
    """rapidocr's pipeline on the served ONNX files, or None when rapidocr is not installed."""
    try:
        from rapidocr import RapidOCR
    except ImportError:
        return None
    ocr = RapidOCR(params={"Global.use_cls": False, "Global.log_level": "warning",
                           "Det.model_path": os.path.join(repo, "textdet", "1", "model.onnx"),
                           "Rec.model_path": os.path.join(repo, "textrec", "1", "model.onnx")})

    def call(img: np.ndarray) -> dict[str, float]:
        res = ocr(img)
        return {"det": res.elapse_list[0] or 0.0, "rec": res.elapse_list[2] or 0.0}

    return call


def steps_of(reply: dict) -> tuple[dict[str, float], float | None]:
    t = reply["timing_us"]
    return {s: t[s] / 1e6 for s in STEPS}, float(reply.get("crop_batch_mean", 0.0))


def main_ocr(args) -> int:
    return bench_pages.run(args, REPORT, bench_pages.pages(), engine, steps_of)
