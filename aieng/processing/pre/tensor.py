"""Raw tensors straight through: each model input arrives as a tensor map.

For models whose clients send tensors ready to run.  Shapes are per request
(no batch dimension); the executor checks them against the session's inputs (dtype and shape).  An input
with a ``reshape`` (Triton's) is checked against its declared shape and reshaped to the graph's (a view).
NaN/Inf are refused in float tensors of a model a model.yaml describes (one described by its graph or a
config.pbtxt takes them, as ONNX Runtime and Triton do: IsNaN, IsInf, -inf attention masks); a string
tensor's elements must be UTF-8 (ONNX Runtime's Python binding takes only ``str``: ``wire/strings``).

``max_request_bytes``: the shared-memory bytes of one request whose inputs all have a declared numeric
dtype and fixed shape (a graph or a config.pbtxt declares both; a model.yaml may): its pool sizes its ring
slots for it (``shmsize.ring_shape``), so a fixed 2,000 x 1,000 input serves without raising
``AIENG_SHM_SLOT_BYTES``.  0 when any input's size is open (a string, an open axis): the configured slots.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aieng.models.repo import ModelSpec
from aieng.wire import shm, strings
from aieng.wire.protocol import INVALID_INPUT, RequestError, decode_tensor


class TensorPreprocessor:
    batchable = False

    def __init__(self, spec: ModelSpec):
        self.names = [i.name for i in spec.inputs]
        self.reshape = {i.name: (i.shape or (), i.reshape) for i in spec.inputs if i.reshape is not None}
        self.max_request_bytes = request_bytes(spec)
        self.finite_only = spec.described_by == "model.yaml"

    def process(self, inputs: dict[str, Any]):
        tensors = []
        seq_len = 0
        for name in self.names:
            if name not in inputs:
                raise RequestError(INVALID_INPUT, f"missing input '{name}'")
            arr = decode_tensor(inputs[name], f"input '{name}'")
            if self.finite_only and arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
                raise RequestError(INVALID_INPUT, f"input '{name}' contains NaN or Inf")
            if arr.dtype.hasobject:
                bad = strings.check_utf8(arr)
                if bad is not None:
                    raise RequestError(INVALID_INPUT, f"input '{name}': element {bad} is not valid UTF-8 "
                                                      "(ONNX Runtime's string tensors hold text)")
            if name in self.reshape:
                arr = _reshaped(arr, name, *self.reshape[name])
            seq_len = max(seq_len, arr.shape[0] if arr.ndim else 0)
            tensors.append((name, arr))
        return tensors, seq_len, {}


def _reshaped(arr: np.ndarray, name: str, dims: tuple, reshape: tuple) -> np.ndarray:
    """``arr`` in the declared ``dims`` (-1: any size) as the graph's ``reshape``."""
    if arr.ndim != len(dims) or any(d != -1 and d != n for d, n in zip(dims, arr.shape)):
        raise RequestError(INVALID_INPUT, f"input '{name}' must have shape {list(dims)}, "
                                          f"got {list(arr.shape)}")
    try:
        return arr.reshape(reshape)
    except ValueError:  # -1 on both sides, but the sizes do not divide
        raise RequestError(INVALID_INPUT, f"input '{name}' of shape {list(arr.shape)} cannot take the "
                                          f"model's shape {list(reshape)}") from None


def request_bytes(spec: ModelSpec) -> int:
    """One request's bytes in a slot when every input's dtype and shape are declared and fixed, else 0."""
    total = 0
    for decl in spec.inputs:
        shape = decl.shape
        if (not isinstance(shape, tuple) or decl.dtype is None
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            return 0
        try:
            dtype = np.dtype(decl.dtype)
        except TypeError:  # "bf16" and the like: no numpy type, never served
            return 0
        if dtype.hasobject:  # a string's size is its client's
            return 0
        total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize + shm.ALIGN
    return total
