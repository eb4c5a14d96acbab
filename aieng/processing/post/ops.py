"""The general postprocess ops' code: softmax, sigmoid, l2_normalize, mean_pool, classify, top_k, threshold,
label_map and tensor, each registered against its declaration (``models/postprocess``: its parameters).

``detection`` (box decoding, non-maximum suppression, DB text boxes) and ``ctc`` (CTC decoding) hold the
others; ``chain`` imports all three, which fills ``op.REGISTRY``.  Each op's docstring says what it reads
and writes; the table in docs/models.md lists them all.  Ops take the request's values as read-only views
(the model's outputs lie in shared memory) and never modify them.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from aieng.models.onnx_meta import read_metadata
from aieng.processing.post.centroid import Centroid
from aieng.processing.post.op import Op, register
from aieng.wire.protocol import INVALID_INPUT, RequestError


def load_labels(labels: Any, spec) -> list[str] | None:
    """Class labels from a file, the ONNX metadata, or given inline (``models/postprocess.LABELS``)."""
    if not labels:
        return None
    if isinstance(labels, list):
        return [str(x) for x in labels]
    if isinstance(labels, dict) and isinstance(labels.get("file"), str):
        with open(spec.file(labels["file"]), encoding="utf-8") as fh:
            return [str(x) for x in json.load(fh)]
    if isinstance(labels, dict) and isinstance(labels.get("metadata"), str):
        return read_metadata(spec.onnx_path)[labels["metadata"]].splitlines()
    raise ValueError("'labels' must be {file: ...}, {metadata: ...} or a list")


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in float64."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float64, stable for large |x|."""
    x = np.asarray(x, np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


class _OneToOne(Op):
    """An op that reads ``source`` and writes ``output`` (default: overwrite ``source``)."""

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.source = cfg["source"]
        self.output = cfg.get("output") or self.source
        self.inputs, self.outputs = [self.source], [self.output]


@register
class Softmax(_OneToOne):
    """softmax(source) along ``axis`` -> output (float32)."""
    NAME = "softmax"

    def __call__(self, state, params, degraded=0):
        return {self.output: softmax(state[self.source], self.cfg["axis"]).astype(np.float32)}


@register
class Sigmoid(_OneToOne):
    """sigmoid(source) elementwise -> output (float32)."""
    NAME = "sigmoid"

    def __call__(self, state, params, degraded=0):
        return {self.output: sigmoid(state[self.source]).astype(np.float32)}


@register
class L2Normalize(_OneToOne):
    """source / ||source|| along the last axis (a zero vector stays zero) -> output (float32)."""
    NAME = "l2_normalize"

    def __call__(self, state, params, degraded=0):
        x = np.asarray(state[self.source], np.float64)
        norm = np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
        return {self.output: (x / norm).astype(np.float32)}


@register
class MeanPool(_OneToOne):
    """Mean over the token axis of ``[tokens, dim]`` (the executor already cut padding, so no mask),
    optionally L2-normalised -> output (float32); also reports ``distance`` to the golden centroid."""
    NAME = "mean_pool"

    def __init__(self, cfg: dict, spec):
        super().__init__({**cfg, "output": cfg.get("output") or "embedding"}, spec)
        self.centroid = Centroid(spec, self.output)

    def distance(self, result: dict[str, Any]) -> float | None:
        return self.centroid.distance(result[self.output])

    def __call__(self, state, params, degraded=0):
        x = state[self.source]
        v = x.mean(axis=0, dtype=np.float64) if x.ndim > 1 else x.astype(np.float64)
        if self.cfg["normalize"]:
            v = v / max(float(np.linalg.norm(v)), 1e-12)
        return {self.output: v.astype(np.float32)}


def _top_k(scores: np.ndarray, k: int, labels: list[str] | None) -> list:
    order = np.argsort(-scores, kind="stable")[:k]  # ties: the lower index first
    return [[labels[i] if labels else str(i), float(scores[i])] for i in order]


def _request_k(params: dict) -> int | None:
    k = params.get("top_k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise RequestError(INVALID_INPUT, "params.top_k must be a positive integer")
    return k


@register
class Classify(Op):
    """Scores -> best label and scores, and ``top_k`` when the request asks (``params.top_k``; skipped at
    degradation level 1+).  The single-op form of the demo classifiers; also reports ``confidence``."""
    NAME = "classify"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.source, self.activation = cfg["source"], cfg["activation"]
        self.label_output, self.scores_output = cfg["label_output"], cfg["scores_output"]
        self.labels = load_labels(cfg["labels"], spec)
        self.inputs, self.outputs = [self.source], [self.label_output, self.scores_output, "top_k"]

    def confidence(self, result: dict[str, Any]) -> float:
        return float(np.max(result[self.scores_output]))

    def __call__(self, state, params, degraded=0):
        scores = state[self.source].reshape(-1).astype(np.float32)
        if self.activation == "softmax":
            scores = softmax(scores).astype(np.float32)
        elif self.activation == "sigmoid":
            scores = sigmoid(scores).astype(np.float32)
        best = int(np.argmax(scores))
        result: dict[str, Any] = {self.label_output: self.labels[best] if self.labels else str(best),
                                  self.scores_output: scores}
        k = _request_k(params)
        if k is not None and degraded < 1:  # degradation level 1: optional postprocessing is skipped
            result["top_k"] = _top_k(scores, k, self.labels)
        return result


@register
class TopK(Op):
    """The ``k`` best of a score vector as ``[[label, score], ...]``, best first (ties: lower index) ->
    output.  ``k`` unset: the request's ``params.top_k``, and nothing when it has none or when the
    model is degraded (level 1+ skips optional postprocessing, as ``classify`` does)."""
    NAME = "top_k"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.source, self.output = cfg["source"], cfg["output"] or "top_k"
        self.labels = load_labels(cfg["labels"], spec)
        self.inputs, self.outputs = [self.source], [self.output]

    def __call__(self, state, params, degraded=0):
        k = self.cfg["k"] or _request_k(params)
        if k is None or (not self.cfg["k"] and degraded >= 1):
            return {}
        return {self.output: _top_k(np.asarray(state[self.source]).reshape(-1), k, self.labels)}


@register
class Threshold(Op):
    """Keeps the rows whose ``source`` score is >= ``min`` (the row's best score when ``source`` is
    ``[N, C]``), in ``source`` and every value named in ``apply_to`` (same first axis)."""
    NAME = "threshold"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.inputs = [cfg["source"]] + list(cfg["apply_to"] or [])
        self.outputs = list(self.inputs)

    def __call__(self, state, params, degraded=0):
        scores = np.asarray(state[self.cfg["source"]])
        best = scores.max(axis=-1) if scores.ndim > 1 else scores
        keep = best >= self.cfg["min"]
        return {name: np.asarray(state[name])[keep] for name in self.inputs}


@register
class LabelMap(Op):
    """Class indices (an int or an int array) -> their labels (a str or a list of str) -> output."""
    NAME = "label_map"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.labels = load_labels(cfg["labels"], spec)
        if not self.labels:
            raise ValueError("'labels' is empty")
        self.output = cfg["output"] or "labels"
        self.inputs, self.outputs = [cfg["source"]], [self.output]

    def __call__(self, state, params, degraded=0):
        idx = np.asarray(state[self.cfg["source"]]).astype(np.int64)
        if idx.ndim == 0:
            return {self.output: self.labels[int(idx)]}
        return {self.output: [self.labels[int(i)] for i in idx.reshape(-1)]}


@register
class Passthrough(Op):
    """Every value so far (at the start: every model output) as a tensor map, copied out of shared
    memory; an output with a ``reshape`` (Triton's: the graph's shape for the declared one) in its
    declared shape."""
    NAME = "tensor"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.inputs, self.outputs = [], []
        self.shapes = {o.name: tuple(o.shape or ()) for o in spec.outputs if o.reshape is not None}

    def __call__(self, state, params, degraded=0):
        if not self.shapes:
            return {k: np.array(v) for k, v in state.items()}
        return {k: np.array(v).reshape(self.shapes[k]) if k in self.shapes else np.array(v)
                for k, v in state.items()}

