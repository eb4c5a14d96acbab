"""The small facts input drift is scored on (``frontend/observe/drift``), one request at a time.

``text_features(encoding, unk_id)``: ``tokens`` (the encoding's length, truncation included) and
``oov_share``, the share of the text's words the vocabulary does not hold whole: a word the tokenizer
maps to its unk token, or splits into several sub-word pieces (a WordPiece or BPE vocabulary spells a
made-up word in pieces and seldom uses unk at all).  ``image_features(img)``: ``width``, ``height``,
``aspect`` (width / height) and ``brightness`` (mean 0..255 over about 64 x 64 pixels taken on a
regular grid, so a page costs the same few microseconds as a thumbnail).  Every value is a plain
float or int; raw text or pixels never leave the worker.  Tabular requests report their features as
given (``tabular``).  What each score means: docs/metrics.md, 'Drift'.
"""
from __future__ import annotations

import numpy as np

BRIGHTNESS_SAMPLES = 64  # grid points per side read for the brightness


def text_features(encoding, unk_id: int | None) -> dict[str, float]:
    ids, words = encoding.ids, encoding.word_ids
    pieces: dict[int, int] = {}
    unknown: set[int] = set()
    for tid, w in zip(ids, words):
        if w is None:  # [CLS], [SEP] and other special tokens
            continue
        pieces[w] = pieces.get(w, 0) + 1
        if tid == unk_id:
            unknown.add(w)
    oov = sum(1 for w, n in pieces.items() if n > 1 or w in unknown)
    return {"tokens": len(ids), "oov_share": round(oov / len(pieces), 4) if pieces else 0.0}


def image_features(img: np.ndarray) -> dict[str, float]:
    """``img``: the decoded HWC (or HW) uint8 image."""
    h, w = int(img.shape[0]), int(img.shape[1])
    sy, sx = max(1, h // BRIGHTNESS_SAMPLES), max(1, w // BRIGHTNESS_SAMPLES)
    brightness = float(img[::sy, ::sx].mean()) if h and w else 0.0
    return {"width": w, "height": h, "aspect": round(w / h, 4) if h else 0.0,
            "brightness": round(brightness, 2)}
