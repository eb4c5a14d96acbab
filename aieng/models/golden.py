"""A version directory's golden set, ``golden.json`` (docs/models.md): read and checked for shape.

``read_golden`` returns the parsed set, None when the version has none, and raises ``ModelError`` for a
malformed one.  Read by the frontend's hot swap (its cases gate a load: ``frontend/versions/golden``) and
by the embedding postprocessing (its expected embeddings make the drift centroid: ``processing/post/
centroid``).
"""
from __future__ import annotations

import json
import os

from aieng.models.spec import ModelError

GOLDEN_FILE = "golden.json"
MAX_CASES = 256


def read_golden(path: str) -> dict | None:
    """``<version dir>/golden.json`` checked for shape, or None when there is none (ModelError if bad)."""
    gpath = os.path.join(path, GOLDEN_FILE)
    if not os.path.isfile(gpath):
        return None
    try:
        with open(gpath, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{gpath}: {exc}") from None
    cases = raw.get("cases") if isinstance(raw, dict) else None
    if not isinstance(cases, list) or not 0 < len(cases) <= MAX_CASES:
        raise ModelError(f"{gpath}: 'cases' must be a list of 1..{MAX_CASES} cases")
    for i, case in enumerate(cases):
        if (not isinstance(case, dict) or not isinstance(case.get("inputs"), dict)
                or not isinstance(case.get("expected"), dict) or not case["expected"]
                or not isinstance(case.get("params", {}), dict)):
            raise ModelError(f"{gpath}: case {i} needs 'inputs' and 'expected' maps "
                                        f"(and optional 'params')")
    for key in ("atol", "rtol"):
        if not isinstance(raw.get(key, 0), (int, float)):
            raise ModelError(f"{gpath}: '{key}' must be a number")
    if not isinstance(raw.get("outputs", {}), dict):
        raise ModelError(f"{gpath}: 'outputs' maps an output name to its tolerance")
    return raw
