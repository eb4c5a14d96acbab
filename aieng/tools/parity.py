"""Parity between two ONNX files of one model: the same sample inputs, accuracy and speed side by side.

* ``sample_requests(spec, n)``: ``n`` deterministic request inputs of the model's own kind;
  ``sample_feeds`` runs them through the server's own preprocessors (``PROCESSORS``), so parity
  compares what the server would feed the model; ``stack`` pads a batch like the executor does.
* ``compare(spec, ref, new)``: per ONNX output ``max_abs_diff``, ``min_cosine``/``mean_cosine`` and
  ``top1`` agreement for the output a ``classify`` postprocess reads.
* ``check(metrics, tol)`` lists every metric outside its tolerance, naming it and by how much;
  ``resolve_tolerances`` merges defaults < model.yaml ``quantize:`` < command line.
* ``speed(...)`` times both files in one process, interleaved run by run, at batch 1 and a bigger
  batch: median ms and new/source ratio, bounded by a run count.

The samples per kind, the metrics and tolerances: docs/models.md, 'Quantizing a model'.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import numpy as np

from aieng.models.repo import ModelSpec

DEFAULT_TOLERANCES: dict[str, float | None] = {
    "min_cosine": 0.99,     # embeddings/tensors: the worst sample's cosine to the source output
    "min_top1": 0.95,       # classifiers: share of samples whose best class is unchanged
    "max_abs_diff": None,   # scale depends on the model: checked only when given
}
SENTENCES = [
    "A man is eating food.", "The quick brown fox jumps over the lazy dog.",
    "Zero-copy shared memory keeps tensors out of the socket.", "ok",
    "The girl is carrying a baby.", "Invoices are due thirty days after the date of issue.",
    "naïve café résumé — unicode 東京 👍", "How do I reset my password?",
    "Quantized models trade a little accuracy for speed.", "It rained all day in the valley.",
    "Stocks fell sharply after the announcement.", "Please find the report attached.",
]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Invoice", "total", "amount",
         "Date:", "2024", "payment", "received", "thank", "you", "Summary", "order", "shipped"]


def render_page(width: int, height: int, seed: int) -> np.ndarray:
    """An upright text page (black on white), BGR uint8, deterministic in ``seed``."""
    import cv2

    rng = np.random.default_rng(seed)
    img = np.full((height, width, 3), 255, np.uint8)
    cv2.putText(img, "DOCUMENT %d" % seed, (50, 80), cv2.FONT_HERSHEY_SIMPLEX, 1.4, (0, 0, 0), 3)
    scale = float(rng.choice([0.6, 0.7, 0.8]))
    step = int(40 * scale / 0.8)
    for y in range(140, height - 40, step):
        x = 50
        while True:
            w = str(rng.choice(WORDS))
            (tw, _), _ = cv2.getTextSize(w + " ", cv2.FONT_HERSHEY_SIMPLEX, scale, 2)
            if x + tw > width - 50:
                break
            cv2.putText(img, w, (x, y), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 2)
            x += tw
    return img


def _images(n: int, start: int) -> list[bytes]:
    import cv2

    rotations = [None, cv2.ROTATE_90_CLOCKWISE, cv2.ROTATE_180, cv2.ROTATE_90_COUNTERCLOCKWISE]
    sizes = [(800, 1100), (640, 900), (1000, 700), (720, 960)]
    out = []
    for i in range(start, start + n):
        page = render_page(*sizes[(i // 4) % len(sizes)], seed=i // 4)
        rot = rotations[i % 4]
        out.append(cv2.imencode(".png", page if rot is None else cv2.rotate(page, rot))[1].tobytes())
    return out


def _tabular_rows(spec: ModelSpec, n: int, start: int) -> list[dict]:
    ref = os.path.join(spec.path, "reference.json")
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as fh:
            cases = [c["input"] for c in json.load(fh)["cases"]]
        return [cases[i % len(cases)] for i in range(start, start + n)]
    with open(spec.file(spec.preprocess.state), encoding="utf-8") as fh:
        state = json.load(fh)
    rng = np.random.default_rng(start)
    rows = []
    for i in range(start, start + n):
        row: dict[str, Any] = {f["name"]: float(f["mean"] + f["std"] * rng.normal())
                               for f in state["numeric"]}
        for f in state["categorical"]:
            cats = f["categories"]
            row[f["name"]] = cats[i % len(cats)] if cats else None
        rows.append(row)
    return rows


def _tensors(spec: ModelSpec, n: int, start: int) -> list[dict]:
    import onnxruntime as ort

    dtypes = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(float16)": np.float16}
    sess = ort.InferenceSession(spec.onnx_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(start)
    out = []
    for _ in range(n):
        req = {}
        for inp in sess.get_inputs():
            shape = [d if isinstance(d, int) and d > 0 else 8 for d in inp.shape[1:]]
            dt = dtypes.get(inp.type, np.float32)
            arr = rng.normal(size=shape) if np.issubdtype(dt, np.floating) else rng.integers(0, 8, shape)
            req[inp.name] = arr.astype(dt)
        out.append(req)
    return out


def sample_requests(spec: ModelSpec, n: int, start: int = 0) -> list[dict[str, Any]]:
    """``n`` request inputs; another ``start`` gives other samples (calibration vs. parity)."""
    kind = spec.preprocess.type
    if kind == "image":
        return [{spec.preprocess.input: b} for b in _images(n, start)]
    if kind == "text":
        name = spec.preprocess.input
        return [{name: SENTENCES[i % len(SENTENCES)] + ("" if i < len(SENTENCES) else f" ({i})")}
                for i in range(start, start + n)]
    if kind == "tabular":
        return _tabular_rows(spec, n, start)
    if kind == "tensor":
        return _tensors(spec, n, start)
    raise ValueError(f"{spec.key}: no sample inputs for preprocess type {kind!r}")


def sample_feeds(spec: ModelSpec, requests: list[dict]) -> list[dict[str, np.ndarray]]:
    from aieng.processing.pre.processors import PROCESSORS

    if spec.preprocess.type == "tensor":  # the server passes client tensors through unchanged
        return [dict(r) for r in requests]
    pre = PROCESSORS[spec.preprocess.type](spec)
    if pre.batchable:
        done = pre.process_many([pre.check(r) for r in requests])
    else:
        done = [pre.process(r) for r in requests]
    return [{name: np.asarray(arr) for name, arr in tensors} for tensors, _, _ in done]


def stack(spec: ModelSpec, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One batch from per-request feeds: variable axes padded to the longest, like the executor."""
    out = {}
    for name in feeds[0]:
        arrs = [f[name] for f in feeds]
        shape = np.max([a.shape for a in arrs], axis=0)
        batch = np.full((len(arrs), *shape), spec.padding.pad_value(name), dtype=arrs[0].dtype)
        for i, a in enumerate(arrs):
            batch[(i, *(slice(0, d) for d in a.shape))] = a
        out[name] = batch
    return out


def session(path: str, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


def run_each(sess, spec: ModelSpec, feeds: list[dict]) -> list[dict[str, np.ndarray]]:
    """Every sample alone (batch 1): no padding can blur the comparison."""
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, (o[0] for o in sess.run(names, stack(spec, [f]))))) for f in feeds]


def classifier_output(spec: ModelSpec) -> str | None:
    """The output a single-op ``classify`` postprocess reads (its top-1 is compared), else None."""
    return spec.postprocess.steps[0].source if spec.postprocess.type == "classify" else None


def compare(spec: ModelSpec, ref: list[dict], new: list[dict]) -> dict[str, dict[str, Any]]:
    top1_of = classifier_output(spec)
    metrics = {}
    for name in ref[0]:
        a = [np.asarray(r[name], np.float64).reshape(-1) for r in ref]
        b = [np.asarray(r[name], np.float64).reshape(-1) for r in new]
        cos = [float(np.dot(x, y) / max(np.linalg.norm(x) * np.linalg.norm(y), 1e-30)) for x, y in zip(a, b)]
        m: dict[str, Any] = {
            "metric": "top1" if name == top1_of else "cosine",
            "max_abs_diff": float(max(np.max(np.abs(x - y)) for x, y in zip(a, b))),
            "min_cosine": min(cos), "mean_cosine": float(np.mean(cos)), "samples": len(a)}
        if name == top1_of:
            m["top1"] = float(np.mean([int(np.argmax(x)) == int(np.argmax(y)) for x, y in zip(a, b)]))
        metrics[name] = m
    return metrics


def resolve_tolerances(model_yaml: dict, cli: dict[str, float | None]) -> dict[str, float | None]:
    """Defaults, then the source model.yaml's ``quantize:`` section, then the command line."""
    tol = dict(DEFAULT_TOLERANCES)
    section = model_yaml.get("quantize") or {}
    if not isinstance(section, dict):
        raise ValueError("model.yaml 'quantize' must be a mapping")
    for key, val in list(section.items()) + [(k, v) for k, v in cli.items() if v is not None]:
        if key not in DEFAULT_TOLERANCES:
            raise ValueError(f"unknown tolerance {key!r} (known: {', '.join(DEFAULT_TOLERANCES)})")
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float))):
            raise ValueError(f"tolerance {key} must be a number, got {val!r}")
        tol[key] = None if val is None else float(val)
    return tol


def check(metrics: dict[str, dict], tol: dict[str, float | None]) -> list[str]:
    """One line per metric outside its tolerance: which output, which metric, by how much."""
    fails = []
    for name, m in metrics.items():
        if m["metric"] == "top1" and tol["min_top1"] is not None and m["top1"] < tol["min_top1"]:
            fails.append(f"{name}: top-1 agreement {m['top1']:.4f} < {tol['min_top1']} "
                         f"(short by {tol['min_top1'] - m['top1']:.4f})")
        if m["metric"] == "cosine" and tol["min_cosine"] is not None and m["min_cosine"] < tol["min_cosine"]:
            fails.append(f"{name}: cosine {m['min_cosine']:.6f} < {tol['min_cosine']} "
                         f"(short by {tol['min_cosine'] - m['min_cosine']:.6f})")
        if tol["max_abs_diff"] is not None and m["max_abs_diff"] > tol["max_abs_diff"]:
            fails.append(f"{name}: max abs diff {m['max_abs_diff']:.6g} > {tol['max_abs_diff']} "
                         f"(over by {m['max_abs_diff'] - tol['max_abs_diff']:.6g})")
    return fails


def speed(spec: ModelSpec, src_path: str, new_path: str, feeds: list[dict], threads: int,
          batches: list[int], runs: int) -> list[dict[str, Any]]:
    """Median ms per run of both files at each batch size, runs interleaved so drift hits both."""
    sessions = {"source": session(src_path, threads), "new": session(new_path, threads)}
    rows = []
    for bs in batches:
        feed = stack(spec, [feeds[i % len(feeds)] for i in range(bs)])
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for rep in range(runs + 2):  # the first two runs of each are warm-up and not counted
            for key, sess in sessions.items():
                t0 = time.perf_counter()
                sess.run(None, feed)
                if rep >= 2:
                    times[key].append((time.perf_counter() - t0) * 1000.0)
        src, new = statistics.median(times["source"]), statistics.median(times["new"])
        rows.append({"batch": bs, "source_ms": round(src, 3), "new_ms": round(new, 3),
                     "ratio": round(new / src, 3), "runs": runs, "threads": threads})
    return rows
