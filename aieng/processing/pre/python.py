"""A team's own preprocessing (``preprocess: {type: python, entry: "model.py:Pre"}``, issue 36).

``Pre(spec)`` is built once per worker per version (``usercode.build``: a ``HookSpec``); ``pre(inputs)``
gets one request's inputs as ``read_request`` decoded them (str, bytes, numbers, lists, numpy arrays from
tensor maps) and returns ``{ONNX input name: array}`` without the batch axis.  When the class has
``batch(list_of_inputs) -> list_of_dicts``, the pool worker hands it every request of this version it
drained together (``batchable``); if ``batch`` raises, each request is run through ``pre`` on its own, so
only a request that fails there fails.

What ``pre`` returns is checked (``Checked``): a dict naming every graph input and nothing else, each
value an array (or anything ``np.asarray`` takes) of the graph's rank less the batch axis, of the graph's
dtype or one numpy casts to it without changing kind (float64 -> float32, int32 -> int64; never float ->
int); a violation answers the request INTERNAL naming the hook and what was wrong (the user's bug, not
the client's).  A ``ValueError`` from the user's code is the client's: INVALID_INPUT with its message;
any other exception INTERNAL ``"<Type>: <message>"`` (``usercode.mapped``).

``seq_len`` (the batcher's length buckets) is the first axis of the longest returned input the model
pads (``padding:`` in model.yaml names it), else 0.  The drift features are the request's plain scalar
inputs, as the tabular processor reports them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aieng.models import onnx_infer
from aieng.models.repo import ModelSpec
from aieng.processing import usercode
from aieng.processing.pre.request import with_arrays
from aieng.wire.protocol import INTERNAL, RequestError


class Checked:
    """The graph's inputs as a hook must return them: name -> (numpy dtype, per-request shape)."""

    def __init__(self, spec: ModelSpec, hook: str):
        graph = onnx_infer.describe(spec.onnx_path)
        batched = spec.batching.batched and graph.batch_axis().batched
        self.hook = hook
        self.inputs: dict[str, tuple[np.dtype, tuple | None]] = {}
        for t in graph.inputs:
            shape = t.shape[1:] if batched and t.shape else t.shape
            self.inputs[t.name] = (np.dtype(t.np_dtype or "object"), shape)
        self.padded = tuple(name for name, _ in spec.padding.values if name in self.inputs)

    def tensors(self, out: Any) -> list[tuple[str, np.ndarray]]:
        if not isinstance(out, dict):
            raise self.wrong(f"returned {type(out).__name__}, not a dict of ONNX inputs")
        extra = [k for k in out if k not in self.inputs]
        if extra:
            raise self.wrong(f"returned {', '.join(map(repr, extra))}, not an input of the graph "
                             f"({', '.join(self.inputs)})")
        tensors = []
        for name, (dtype, shape) in self.inputs.items():
            if name not in out:
                raise self.wrong(f"returned no {name!r}")
            tensors.append((name, self.array(name, out[name], dtype, shape)))
        return tensors

    def array(self, name: str, value: Any, dtype: np.dtype, shape: tuple | None) -> np.ndarray:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        if arr.dtype != dtype:
            if dtype.hasobject and arr.dtype.kind in "US":
                arr = arr.astype(object)
            elif not np.can_cast(arr.dtype, dtype, "same_kind"):
                raise self.wrong(f"returned {name!r} as {arr.dtype}; the graph takes {dtype}")
            else:
                arr = arr.astype(dtype)
        if shape is not None:
            if arr.ndim != len(shape):
                raise self.wrong(f"returned {name!r} of shape {list(arr.shape)}; the graph takes "
                                 f"{len(shape)} axes per request (no batch axis)")
            for got, want in zip(arr.shape, shape):
                if want is not None and got != want:
                    raise self.wrong(f"returned {name!r} of shape {list(arr.shape)}; the graph takes "
                                     f"{['?' if w is None else w for w in shape]} per request")
        return arr

    def seq_len(self, tensors: list[tuple[str, np.ndarray]]) -> int:
        return max((a.shape[0] for n, a in tensors if n in self.padded and a.ndim), default=0)

    def wrong(self, what: str) -> RequestError:
        return RequestError(INTERNAL, f"{self.hook} {what}")


def features(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in inputs.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}


class PythonPreprocessor:
    batchable = False  # set per instance: True when the user's class has ``batch``

    def __init__(self, spec: ModelSpec):
        cfg = spec.preprocess
        self.hook = cfg.entry
        hook = usercode.build(spec, cfg.entry, cfg.params.thaw())
        # the instance is called (``pre(inputs)``); a class may name the method ``pre`` instead
        self.pre = hook if callable(hook) else getattr(hook, "pre", None)
        if not callable(self.pre):
            raise TypeError(f"{self.hook}: the instance is not callable and has no pre(inputs) method")
        self.batch = getattr(hook, "batch", None)
        self.batchable = callable(self.batch)
        self.checked = Checked(spec, self.hook)
        self.tensors = tuple(i.name for i in spec.inputs if i.kind == "tensor")

    def decoded(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """A declared ``tensor`` input's map as its numpy array (a view of the frame, read-only)."""
        return with_arrays(self.tensors, inputs)

    def prepared(self, inputs: dict[str, Any], out: Any):
        tensors = self.checked.tensors(out)
        return tensors, self.checked.seq_len(tensors), features(inputs)

    def process(self, inputs: dict[str, Any]):
        return self.prepared(inputs, self.call(self.decoded(inputs)))

    def call(self, inputs: dict[str, Any]) -> Any:
        try:
            return self.pre(inputs)
        except Exception as exc:
            raise usercode.mapped(exc, self.hook) from exc

    def check(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return self.decoded(inputs)

    def process_many(self, many: list[dict[str, Any]]) -> list:
        """One ``batch`` call; each item is the request's prepared tuple or its ``RequestError``."""
        try:
            outs = self.batch(many)
            if not isinstance(outs, (list, tuple)) or len(outs) != len(many):
                raise TypeError("batch did not return one result per request")
        except Exception:  # the whole call failed: each request on its own, so only a bad one fails
            return [self.one(inputs) for inputs in many]
        results = []
        for inputs, out in zip(many, outs):
            try:
                results.append(self.prepared(inputs, out))
            except RequestError as exc:
                results.append(exc)
        return results

    def one(self, inputs: dict[str, Any]):
        try:
            return self.prepared(inputs, self.call(inputs))
        except RequestError as exc:
            return exc
