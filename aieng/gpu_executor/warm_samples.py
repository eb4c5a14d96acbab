"""Triton's ``model_warmup`` samples (``spec.warmup``, from a config.pbtxt: ``models/triton_config.py``), run
on a version's session after its own warm-up and before it is ready, as Triton runs them before a version
serves.

Each sample's inputs are ``zero_data`` (zeros; empty strings for BYTES), ``random_data`` (seeded: the same
on every start) or ``input_data_file`` (``<model>/warmup/<file>``: the tensor's raw bytes, row-major; for
BYTES each element a 4-byte little-endian length and its bytes, as Triton reads it); ``batch_size`` rows of
one row's ``dims`` are stacked (a model taking whole shapes gets ``dims`` as they are), and the sample
runs ``count`` times.  A sample that fails fails the
version's load (``RuntimeError`` naming the sample), as in Triton.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from aieng.models.sections import WarmupInput, WarmupSample
from aieng.models.spec import ModelSpec

WARMUP_DIR = "warmup"


def _strings(raw: bytes, n: int) -> np.ndarray:
    out, pos = [], 0
    for _ in range(n):
        (size,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4:pos + 4 + size])
        pos += 4 + size
    return np.array(out, dtype=object)


def _row(w: WarmupInput, dtype: np.dtype, mdir: str, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(w.dims)
    n = int(np.prod(shape)) if shape else 1
    text = w.datatype == "BYTES"
    if w.source == "input_data_file":
        with open(os.path.join(mdir, WARMUP_DIR, w.data_file), "rb") as fh:
            raw = fh.read()
        arr = _strings(raw, n) if text else np.frombuffer(raw, dtype=dtype, count=n)
        return arr.reshape(shape)
    if text:
        return np.full(shape, b"", dtype=object)
    if w.source == "zero_data":
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 100, shape).astype(dtype)  # small values: safe for every integer type


def feeds(sample: WarmupSample, dtypes: dict[str, np.dtype], mdir: str, batched: bool = True,
          shapes: dict[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """The sample's input tensors: ``batch_size`` rows (at least one) each, or the whole shape as given
    for a model that takes whole shapes (``batched`` False: Triton's max_batch_size 0); ``shapes``: the
    graph's shape of each input with a ``reshape``."""
    rng = np.random.default_rng(0)
    shapes = shapes or {}

    def row(w: WarmupInput) -> np.ndarray:  # in the graph's shape where the input has a ``reshape``
        arr = _row(w, dtypes[w.name], mdir, rng)
        return arr.reshape(shapes[w.name]) if w.name in shapes else arr

    if not batched:
        return {w.name: row(w) for w in sample.inputs}
    rows = max(1, sample.batch_size)
    return {w.name: np.stack([row(w) for _ in range(rows)]) for w in sample.inputs}


def run_samples(sess, spec: ModelSpec) -> int:
    """Every sample of ``spec.warmup`` on ``sess`` (``sessions.ModelSession``); the number of runs."""
    runs = 0
    mdir = os.path.dirname(spec.path)
    dtypes = {i.name: i.dtype for i in sess.inputs}
    shapes = {i.name: i.reshape for i in spec.inputs if i.reshape is not None}
    for sample in spec.warmup:
        try:
            batch = feeds(sample, dtypes, mdir, sess.batched, shapes)
            for _ in range(sample.count):
                sess.run(batch)
                runs += 1
        except Exception as exc:
            raise RuntimeError(f"model_warmup sample '{sample.name}' failed: {type(exc).__name__}: "
                               f"{exc}") from None
    return runs
