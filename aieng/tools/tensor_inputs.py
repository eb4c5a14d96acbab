"""Requests for any tensor model, made from its spec: what ``aieng bench``, ``aieng load`` and
scripts/ab_servers.py send to a model whose clients send tensors (``preprocess: {type: tensor}``: a bare
ONNX file, a Triton config.pbtxt, a tensor model.yaml).

``tensor_inputs(spec)`` reads each input as a request carries it (``TensorInput``): its name, numpy dtype
(``object`` for a string tensor) and per-request shape, ``None`` for an open axis.  Dtype and rank come from
the ONNX graph, which is what the executor checks a request against (a hand-written model.yaml may declare
neither).  A batched model (the spec batches and every graph input's first axis is open: the executor's own
rule) takes one row per request, the shape without the batch axis; an unbatched one takes whole shapes.

``make_rows(inputs, n, seed, shapes)`` makes ``n`` requests from ``POOL`` distinct ones, cycled (a big image
model's inputs stay a few MB).  Open axes: ``shapes`` (``parse_shapes``: ``32`` sets every open axis,
``name=1x32`` one input's whole shape), else ``OPEN_SIZE``; every request of a run has the same shapes, so
exact-shape batching batches them all together.  Values are safe for a graph of that type: floats in
[-1, 1), ints 0..99 (token ids under any vocabulary), except an input named ``*mask*`` all 1s and
``*type_ids*``/``*segment*`` all 0s (BERT-like graphs index two-row tables with those), bools at random,
strings short words as UTF-8 bytes.  A row for an unbatched model is an ``UnbatchedRow``, so the OIP senders
(``loadgen.oip_tensors``) send its shapes as they are, without the leading row of 1 a batched model takes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from aieng.models.onnx_infer import describe
from aieng.models.spec import ModelSpec

OPEN_SIZE = 16  # an open axis other than the batch axis, unless --shape says (a sequence of 16 tokens)
POOL = 16  # distinct requests per run, cycled
INT_HIGH = 100  # ints are drawn from 0..INT_HIGH-1
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa")


@dataclass(frozen=True)
class TensorInput:
    name: str
    dtype: str  # numpy dtype name; "object" for a string tensor (OIP BYTES)
    shape: tuple[int | None, ...]  # per request; None: an open axis


@dataclass(frozen=True)
class Shapes:
    """``--shape``: the size of every open axis, and whole per-request shapes by input name."""
    open_size: int = OPEN_SIZE
    by_name: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def of(self, t: TensorInput) -> tuple[int, ...]:
        given = dict(self.by_name).get(t.name)
        if given is None:
            return tuple(self.open_size if d is None else d for d in t.shape)
        if len(given) != len(t.shape) or any(d is not None and d != g for d, g in zip(t.shape, given)):
            raise ValueError(f"--shape {t.name}={'x'.join(map(str, given))} does not fit its shape "
                             f"[{', '.join('?' if d is None else str(d) for d in t.shape)}] per request")
        return given


class UnbatchedRow(dict):
    """One request's tensors for a model taking whole shapes (no batch axis): sent over OIP as they are."""


def parse_shapes(specs: list[str] | None) -> Shapes:
    """``["32", "pixel_values=3x224x224"]`` -> ``Shapes``; ValueError naming a malformed one."""
    open_size, named = OPEN_SIZE, []
    for spec in specs or ():
        name, _, dims = spec.rpartition("=")
        try:
            sizes = tuple(int(d) for d in dims.replace(",", "x").split("x") if d.strip())
        except ValueError:
            sizes = ()
        if not sizes or any(d < 0 for d in sizes) or (not name and len(sizes) != 1):
            raise ValueError(f"--shape {spec!r}: give N (every open axis) or NAME=D1xD2... (one input's "
                             "per-request shape)")
        if name:
            named.append((name, sizes))
        else:
            open_size = sizes[0]
    return Shapes(open_size, tuple(named))


def is_tensor_model(spec: ModelSpec) -> bool:
    return spec.preprocess.type == "tensor" and bool(spec.onnx_path)


def tensor_inputs(spec: ModelSpec) -> tuple[tuple[TensorInput, ...], bool]:
    """Each input as one request carries it, and whether the model batches (one row per request)."""
    info = describe(spec.onnx_path)
    batched = bool(spec.batching.batched) and bool(info.inputs) and all(t.first_axis_open
                                                                        for t in info.inputs)
    out = []
    for t in info.inputs:
        shape = (None,) if t.shape is None else (t.shape[1:] if batched else t.shape)
        out.append(TensorInput(t.name, t.np_dtype or "float32", tuple(shape)))
    return tuple(out), batched


def values(t: TensorInput, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One request's tensor for ``t`` (the module's doc: what is safe per type)."""
    dt = np.dtype(t.dtype)
    lname = t.name.lower()
    if dt.kind == "O":
        arr = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            arr[idx] = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4)))).encode()
        return arr
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        if "mask" in lname:
            return np.ones(shape, dtype=dt)
        if "type_ids" in lname or "segment" in lname:
            return np.zeros(shape, dtype=dt)
        return rng.integers(0, INT_HIGH, size=shape).astype(dt)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dt)


def make_rows(inputs: tuple[TensorInput, ...], batched: bool, n: int, seed: int = 0,
              shapes: Shapes = Shapes()) -> list[dict[str, Any]]:
    """``n`` requests (``POOL`` distinct ones, cycled), each ``{name: ndarray}``."""
    rng = np.random.default_rng(seed)
    sized = [(t, shapes.of(t)) for t in inputs]
    pool = []
    for _ in range(min(n, POOL)):
        row = {t.name: values(t, shape, rng) for t, shape in sized}
        pool.append(row if batched else UnbatchedRow(row))
    return [pool[i % len(pool)] for i in range(n)]


def rows_for(spec: ModelSpec, n: int, seed: int = 0, shapes: Shapes = Shapes()) -> list[dict[str, Any]]:
    inputs, batched = tensor_inputs(spec)
    return make_rows(inputs, batched, n, seed, shapes)
