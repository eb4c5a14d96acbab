"""Raw model outputs -> answers.  One class per model.yaml ``postprocess.type``.

Each takes the request's output views (read in place from shared memory) and
the request ``params`` and the model's degradation level at admission (a
typed field set by the frontend, never by a client: level 1+ skips optional
steps such as ``top_k``) and returns ``{output name: value}`` where a value is a
str, a number, a list, or a numpy array (sent as a tensor map).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from aieng.model_repo import ModelSpec
from aieng.onnx_meta import read_metadata
from aieng.protocol import INVALID_INPUT, RequestError


class MeanPool:
    """Mean over the token axis (the executor already cut padding), optional L2 norm."""

    def __init__(self, spec: ModelSpec):
        cfg = spec.postprocess
        self.source, self.output = cfg["source"], cfg.get("output", "embedding")
        self.normalize = bool(cfg.get("normalize", True))

    def __call__(self, outs: dict[str, np.ndarray], params: dict, degraded: int = 0) -> dict[str, Any]:
        x = outs[self.source]
        v = x.mean(axis=0, dtype=np.float64) if x.ndim > 1 else x.astype(np.float64)
        if self.normalize:
            v = v / max(float(np.linalg.norm(v)), 1e-12)
        return {self.output: v.astype(np.float32)}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


class Classify:
    """Scores -> label (and optional top-k), labels from a file or ONNX metadata."""

    def __init__(self, spec: ModelSpec):
        cfg = spec.postprocess
        self.source = cfg["source"]
        self.activation = cfg.get("activation", "none")
        if self.activation not in ("none", "softmax", "sigmoid"):
            raise ValueError(f"{spec.key}: unknown activation {self.activation!r}")
        self.label_output = cfg.get("label_output", "label")
        self.scores_output = cfg.get("scores_output", "scores")
        labels = cfg.get("labels") or {}
        if "file" in labels:
            with open(spec.file(labels["file"]), encoding="utf-8") as fh:
                self.labels = [str(x) for x in json.load(fh)]
        elif "metadata" in labels:
            self.labels = read_metadata(spec.onnx_path)[labels["metadata"]].splitlines()
        else:
            self.labels = None

    def confidence(self, result: dict[str, Any]) -> float:
        return float(np.max(result[self.scores_output]))

    def __call__(self, outs: dict[str, np.ndarray], params: dict, degraded: int = 0) -> dict[str, Any]:
        scores = outs[self.source].reshape(-1).astype(np.float32)
        if self.activation == "softmax":
            scores = _softmax(scores.astype(np.float64)).astype(np.float32)
        elif self.activation == "sigmoid":
            x = scores.astype(np.float64)
            e = np.exp(-np.abs(x))  # stable for large |x|
            scores = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)
        best = int(np.argmax(scores))
        result: dict[str, Any] = {
            self.label_output: self.labels[best] if self.labels else str(best),
            self.scores_output: scores,
        }
        top_k = params.get("top_k")
        if top_k is not None and degraded >= 1:
            top_k = None  # degradation level 1: optional postprocessing is skipped
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
                raise RequestError(INVALID_INPUT, "params.top_k must be a positive integer")
            order = np.argsort(-scores, kind="stable")[:top_k]
            result["top_k"] = [[self.labels[i] if self.labels else str(i), float(scores[i])] for i in order]
        return result


class Passthrough:
    """Every model output as a tensor map."""

    def __init__(self, spec: ModelSpec):
        pass

    def __call__(self, outs: dict[str, np.ndarray], params: dict, degraded: int = 0) -> dict[str, Any]:
        return {k: np.array(v) for k, v in outs.items()}


OPS = {"mean_pool": MeanPool, "classify": Classify, "tensor": Passthrough}
