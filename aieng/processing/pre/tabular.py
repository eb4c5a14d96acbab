"""Named numeric/categorical features -> one float32 feature vector.

The model directory's ``preprocess.json`` (written when the model was
trained) holds the state: per numeric feature its missing-value fill, clip
range, mean and std; per categorical feature its category list.  Vector layout:
standardised numerics in order, then for each categorical a one-hot block of
``len(categories) + 1`` where the last position is the unknown bucket (unknown
or missing values land there).
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from aieng.models.repo import ModelSpec
from aieng.wire.protocol import INVALID_INPUT, RequestError


class TabularPreprocessor:
    batchable = False

    def __init__(self, spec: ModelSpec):
        with open(spec.file(spec.preprocess.state), encoding="utf-8") as fh:
            state = json.load(fh)
        self.tensor = spec.preprocess.tensor or state.get("tensor", "features")
        self.numeric = state["numeric"]
        self.categorical = [dict(c, index={v: i for i, v in enumerate(c["categories"])})
                            for c in state["categorical"]]
        self.known = {f["name"] for f in self.numeric} | {c["name"] for c in self.categorical}
        self.required = {i.name for i in spec.inputs if not i.optional}
        self.width = len(self.numeric) + sum(len(c["categories"]) + 1 for c in self.categorical)

    def process(self, inputs: dict[str, Any]):
        unknown = set(inputs) - self.known
        if unknown:
            raise RequestError(INVALID_INPUT, f"unknown features: {', '.join(sorted(map(str, unknown)))}")
        missing = self.required - {k for k, v in inputs.items() if v is not None}
        if missing:
            raise RequestError(INVALID_INPUT, f"missing features: {', '.join(sorted(missing))}")
        vec = np.zeros(self.width, dtype=np.float32)
        for i, f in enumerate(self.numeric):
            v = inputs.get(f["name"])
            if v is None or (isinstance(v, float) and math.isnan(v)):
                v = f["fill"]
            elif isinstance(v, bool) or not isinstance(v, (int, float)):
                raise RequestError(INVALID_INPUT, f"feature '{f['name']}' must be a number or nil")
            lo, hi = f["clip"]
            v = min(max(float(v), lo), hi)
            vec[i] = (v - f["mean"]) / f["std"]
        pos = len(self.numeric)
        for c in self.categorical:
            v = inputs.get(c["name"])
            if v is not None and not isinstance(v, str):
                raise RequestError(INVALID_INPUT, f"feature '{c['name']}' must be a string or nil")
            n = len(c["categories"])
            vec[pos + c["index"].get(v, n)] = 1.0
            pos += n + 1
        # The raw values go to the frontend's drift monitor (binned there, never logged).
        feats = {k: v for k, v in inputs.items()
                 if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        return [(self.tensor, vec)], 0, feats

    def sample(self, nbytes: int) -> dict[str, Any]:
        """A row with every feature set (``nbytes`` does not change a row's cost), for measuring what
        preprocessing costs."""
        return ({f["name"]: f["fill"] for f in self.numeric}
                | {c["name"]: (c["categories"] or [None])[0] for c in self.categorical})
