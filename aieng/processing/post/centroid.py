"""The output drift fact of an embedding model: the cosine distance of an answer to its golden centroid.

The centroid is the mean of the L2-normalised embeddings a version's golden set expects
(``golden.json``, ``expected[<output>]`` of each case), normalised again; a version without a golden
set (or whose cases do not name that output) has none, and its answers carry no ``distance``.
``distance(v)`` is ``1 - cos(v, centroid)``: one dot product, microseconds.  The frontend scores its
distribution (``frontend/observe/drift``); docs/metrics.md, 'Drift'.
"""
from __future__ import annotations

import numpy as np

from aieng.models.golden import read_golden
from aieng.models.spec import ModelError


class Centroid:
    def __init__(self, spec, output: str):
        self.vector: np.ndarray | None = None
        try:
            golden = read_golden(spec.path)
            rows = [np.asarray(c["expected"][output], np.float64).ravel()
                    for c in (golden or {}).get("cases", []) if output in c["expected"]]
        except (ModelError, ValueError, TypeError):  # a malformed set (its load is refused) or non-numbers
            return
        if not rows or len({r.shape for r in rows}) != 1:
            return
        unit = [r / max(float(np.linalg.norm(r)), 1e-12) for r in rows]
        mean = np.mean(unit, axis=0)
        self.vector = mean / max(float(np.linalg.norm(mean)), 1e-12)

    def distance(self, v: np.ndarray) -> float | None:
        c = self.vector
        if c is None or v.size != c.size:
            return None
        v = np.asarray(v, np.float64).ravel()
        return round(1.0 - float(np.dot(v, c)) / max(float(np.linalg.norm(v)), 1e-12), 6)
