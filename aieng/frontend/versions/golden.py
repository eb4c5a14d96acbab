"""Golden sets: a version directory's ``golden.json`` (docs/models.md), read and compared.

``read_golden`` (``aieng.models.golden``) checks the file's shape (a malformed one refuses the load:
``ModelError``); ``compare`` says whether one answer matches its case within the set's tolerances (None)
or why not, in one line.  Pure: the hot swap (``hotswap.py``) runs the cases through the real pipeline.
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

from aieng.wire import protocol as p


def _input(value: Any) -> Any:
    """JSON has no bytes: ``{"b64": "..."}`` is an image (or bin) input."""
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return value


def compare(golden: dict, expected: dict, got: dict) -> str | None:
    """None when ``got`` matches ``expected`` within tolerance, else why not (one line)."""
    for name, want in expected.items():
        if name not in got:
            return f"output {name!r} is missing"
        tol = dict({"atol": golden.get("atol", 1e-5), "rtol": golden.get("rtol", 0.0)},
                   **((golden.get("outputs") or {}).get(name) or {}))
        have = got[name]
        if isinstance(have, dict) and "dtype" in have:
            have = p.decode_tensor(have, name).tolist()
        if isinstance(want, str) or isinstance(want, bool) or want is None:
            if have != want:
                return f"output {name!r}: expected {want!r}, got {have!r}"
            continue
        try:
            a, b = np.asarray(have, dtype=np.float64), np.asarray(want, dtype=np.float64)
        except (TypeError, ValueError):
            if have != want:
                return f"output {name!r}: expected {want!r}, got {have!r}"
            continue
        if a.shape != b.shape:
            return f"output {name!r}: shape {list(a.shape)}, expected {list(b.shape)}"
        if "min_cosine" in tol:
            cos = float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))
            if cos < tol["min_cosine"]:
                return f"output {name!r}: cosine {cos:.6f} < {tol['min_cosine']}"
        elif not np.allclose(a, b, atol=tol["atol"], rtol=tol["rtol"]):
            worst = float(np.max(np.abs(a - b))) if a.size else 0.0
            return f"output {name!r}: max abs difference {worst:.3g} over atol {tol['atol']}"
    return None
