"""Write docs/protocol.openapi.json: the native protocol's OpenAPI-style document with the default
configuration (``aieng.gateway.nativedoc``; a running server serves its own at /v2/native.json).
tests/unit/test_openapi_docs.py checks the committed file equals what this writes.

    PYTHONPATH=. python scripts/gen_native_openapi.py
"""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aieng.config import Config  # noqa: E402
from aieng.gateway.nativedoc import native_document  # noqa: E402

OUT = os.path.join(ROOT, "docs", "protocol.openapi.json")


def text() -> str:
    return json.dumps(native_document(Config()), indent=2) + "\n"


if __name__ == "__main__":
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text())
    print(f"wrote {OUT}")
