"""Shared by the unit tests that read the demo model directories."""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import pytest

from aieng.models.repo import load_spec
from aieng.models.sections import Postprocess, Preprocess

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"

needs_demo_models = pytest.mark.skipif(
    not all((MODELS / m / "1" / "model.onnx").is_file() for m in ("minilm", "orientation", "tabular")),
    reason="demo models missing: run scripts/fetch_models.py")


@lru_cache(maxsize=None)
def spec(name: str):
    return load_spec(name, "1", str(MODELS / name / "1"))


def spec_with(name: str, section: str, **settings):
    """The demo spec with ``settings`` merged into its ``preprocess`` or ``postprocess`` section."""
    s = spec(name)
    parse = {"preprocess": Preprocess.parse, "postprocess": Postprocess.parse}[section]
    return dataclasses.replace(s, **{section: parse({**getattr(s, section).section(), **settings})})
