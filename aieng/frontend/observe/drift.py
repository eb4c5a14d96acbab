"""Input drift per model and feature: population stability index (PSI) of recent
traffic against the reference population saved in the model directory.

A model opts in with ``drift: {reference: drift.json}`` in model.yaml; the file
holds, per feature, either numeric bin ``edges`` and the reference share of each
of the ``len(edges) + 1`` bins, or ``categories`` and their shares (+ unknown).
Preprocess workers report each request's feature values in ``info`` (token count,
image width/height, tabular features); the frontend bins them into a sliding
window (last ``window`` values per feature) and computes

    PSI = sum_i (a_i - e_i) * ln(a_i / e_i)

with a the window's shares and e the reference's (both floored at 1e-4).  Below
0.1 is usually read as stable, above 0.25 as a shift worth a look.  Only binned
counts are kept, never the values themselves.
"""
from __future__ import annotations

import bisect
import json
import math
from collections import deque

from aieng.model_repo import ModelSpec

MIN_OBSERVATIONS = 50
FLOOR = 1e-4


class _Feature:
    def __init__(self, ref: dict, window: int):
        self.edges = ref.get("edges")
        self.index = {c: i for i, c in enumerate(ref.get("categories") or [])}
        self.expected = [max(FLOOR, float(p)) for p in ref["proportions"]]
        self.recent: deque[int] = deque(maxlen=window)

    def observe(self, value) -> None:
        if value is None or isinstance(value, bool):
            return
        if self.edges is not None:
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.recent.append(bisect.bisect_right(self.edges, value))
        elif isinstance(value, str):
            self.recent.append(self.index.get(value, len(self.expected) - 1))

    def psi(self) -> float | None:
        n = len(self.recent)
        if n < MIN_OBSERVATIONS:
            return None
        counts = [0] * len(self.expected)
        for b in self.recent:
            counts[b] += 1
        total = 0.0
        for c, e in zip(counts, self.expected):
            a = max(FLOOR, c / n)
            total += (a - e) * math.log(a / e)
        return total


class DriftMonitor:
    def __init__(self, specs: dict[str, dict[str, ModelSpec]], window: int = 1000):
        self.features: dict[tuple[str, str], dict[str, _Feature]] = {}
        for versions in specs.values():
            for spec in versions.values():
                ref_file = (spec.extra.get("drift") or {}).get("reference")
                if not ref_file:
                    continue
                with open(spec.file(ref_file), encoding="utf-8") as fh:
                    ref = json.load(fh)
                self.features[(spec.name, spec.version)] = {
                    name: _Feature(f, window) for name, f in ref["features"].items()}

    def observe(self, model: str, version: str, info: dict) -> None:
        feats = self.features.get((model, version))
        if not feats:
            return
        values = info.get("features") or info
        for name, feat in feats.items():
            feat.observe(values.get(name))

    def scores(self) -> dict[tuple[str, str, str], float]:
        out = {}
        for (model, version), feats in self.features.items():
            for name, feat in feats.items():
                psi = feat.psi()
                if psi is not None:
                    out[(model, version, name)] = psi
        return out
