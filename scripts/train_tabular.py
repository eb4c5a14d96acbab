"""Train the `tabular` demo model (penguin species) and export it to ONNX.

Contract
--------
``train(out_dir)`` (called by scripts/fetch_models.py; also runnable as
``python scripts/train_tabular.py OUT_DIR``) writes into ``out_dir``:

* ``preprocess.json`` -- the feature state the server's tabular preprocessor reads::

      {"numeric": [{"name", "mean", "std", "fill", "clip": [lo, hi]}, ...],
       "categorical": [{"name", "categories": [...]}, ...],
       "tensor": "features", "dtype": "float32"}

  Feature vector, in this order: for each numeric feature, value (missing key,
  None or NaN -> ``fill``) clipped to ``[lo, hi]`` then ``(x - mean) / std``;
  then for each categorical feature a one-hot of length ``len(categories) + 1``
  whose last slot is the unknown bucket (value not in ``categories`` by exact
  string equality, or missing/None -> last slot).  ``fill`` is the training
  median, ``clip`` the 0.5th/99.5th training percentiles, ``mean``/``std``
  (ddof=0) are computed on the filled+clipped training column.
* ``labels.json`` -- JSON list of class names in output order.
* ``model.onnx`` -- Gemm -> Relu -> Gemm -> Softmax; input ``features`` float32
  [batch, F], output ``probabilities`` float32 [batch, 3]; opset 17, IR 8.
  Written last (atomically), so its presence means the directory is complete.
* ``reference.json`` -- ``{"labels": [...], "cases": [{"input": {...},
  "expected_label": str, "expected_probabilities": [3 floats],
  "species": true label}, ...]}``: ~20 test-split rows, some with missing
  features (omitted keys or explicit nulls), one with island "Atlantis", one
  empty row.  Expected values come from this file's own featuriser + sklearn.

Data is read from the CSV shipped inside the ``palmerpenguins`` package with
the csv module (the package itself imports pandas; we never import it).
Deterministic: fixed split seed and MLP random_state.  Raises RuntimeError if
the ONNX export disagrees with ``predict_proba`` by more than 1e-5.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

NUMERIC = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
CATEGORICAL = ["island", "sex"]
TARGET = "species"
SEED = 0
ATOL = 1e-5


def _csv_path() -> Path:
    spec = importlib.util.find_spec("palmerpenguins")  # does not execute the package
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("palmerpenguins is not installed (pip install palmerpenguins)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "penguins.csv"
    if not path.is_file():
        raise RuntimeError(f"penguins.csv not found in the palmerpenguins package at {path}")
    return path


def load_rows() -> list[dict]:
    """All penguin rows as dicts; 'NA' -> None, numeric columns -> float."""
    rows = []
    with open(_csv_path(), newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            row = {TARGET: rec[TARGET]}
            for k in NUMERIC:
                row[k] = None if rec[k] in ("", "NA") else float(rec[k])
            for k in CATEGORICAL:
                row[k] = None if rec[k] in ("", "NA") else rec[k]
            rows.append(row)
    return rows


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fit_state(rows: list[dict]) -> dict:
    numeric = []
    for k in NUMERIC:
        vals = np.array([r[k] for r in rows if not _missing(r.get(k))], dtype=np.float64)
        lo, hi = (float(x) for x in np.percentile(vals, [0.5, 99.5]))
        fill = float(np.median(vals))
        col = np.clip(np.array([fill if _missing(r.get(k)) else r[k] for r in rows]), lo, hi)
        std = float(col.std())
        numeric.append({"name": k, "mean": float(col.mean()), "std": std if std > 0 else 1.0,
                        "fill": fill, "clip": [lo, hi]})
    categorical = [{"name": k, "categories": sorted({r[k] for r in rows if r.get(k) is not None})}
                   for k in CATEGORICAL]
    return {"numeric": numeric, "categorical": categorical, "tensor": "features", "dtype": "float32"}


def featurize(state: dict, rows: list[dict]) -> np.ndarray:
    out = []
    for r in rows:
        vec = []
        for spec in state["numeric"]:
            v = r.get(spec["name"])
            x = spec["fill"] if _missing(v) else float(v)
            x = min(max(x, spec["clip"][0]), spec["clip"][1])
            vec.append((x - spec["mean"]) / spec["std"])
        for spec in state["categorical"]:
            cats = spec["categories"]
            onehot = [0.0] * (len(cats) + 1)
            v = r.get(spec["name"])
            onehot[cats.index(v) if isinstance(v, str) and v in cats else len(cats)] = 1.0
            vec.extend(onehot)
        out.append(vec)
    return np.asarray(out, dtype=np.float64).astype(np.float32)


def export_onnx(clf, n_features: int):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if clf.activation != "relu" or len(clf.coefs_) != 2 or clf.out_activation_ != "softmax":
        raise RuntimeError("export_onnx only supports one relu hidden layer + softmax output")
    inits = [numpy_helper.from_array(np.asarray(a, dtype=np.float32), name) for a, name in
             [(clf.coefs_[0], "W1"), (clf.intercepts_[0], "b1"),
              (clf.coefs_[1], "W2"), (clf.intercepts_[1], "b2")]]
    nodes = [helper.make_node("Gemm", ["features", "W1", "b1"], ["h1"], name="dense1"),
             helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
             helper.make_node("Gemm", ["a1", "W2", "b2"], ["logits"], name="dense2"),
             helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1, name="softmax")]
    n_classes = len(clf.classes_)
    graph = helper.make_graph(
        nodes, "penguin_mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", n_features])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", n_classes])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="aieng-scripts-train_tabular")
    model.ir_version = 8
    helper.set_model_props(model, {"labels": json.dumps([str(c) for c in clf.classes_])})
    onnx.checker.check_model(model)
    return model


def _reference_cases(test_rows: list[dict]) -> list[dict]:
    """~20 test rows as server inputs (missing -> key omitted), with a few tweaks."""
    cases = []
    for i, r in enumerate(test_rows[:19]):
        inp = {k: r[k] for k in NUMERIC + CATEGORICAL if r[k] is not None}
        if i == 2:
            inp.pop("bill_length_mm", None)         # omitted numeric
        elif i == 5:
            inp["body_mass_g"] = None               # explicit null numeric
            inp["sex"] = None                       # explicit null category
        elif i == 8:
            inp["island"] = "Atlantis"              # unknown category
        elif i == 11:
            inp.pop("flipper_length_mm", None)
            inp.pop("sex", None)
        elif i == 14:
            inp["flipper_length_mm"] = 10000.0      # far outside the clip range
        cases.append((inp, r[TARGET]))
    cases.append(({}, None))                        # everything missing
    return cases


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def drift_reference(rows: list[dict]) -> dict:
    """Reference population of every input feature, for the server's drift score (PSI):
    numeric features as decile edges and the share of training rows in each of the
    len(edges)+1 bins; categorical ones as category shares (+ the unknown bucket)."""
    feats = {}
    for k in NUMERIC:
        vals = np.array([r[k] for r in rows if r[k] is not None], dtype=np.float64)
        edges = sorted(set(np.quantile(vals, np.linspace(0.1, 0.9, 9)).round(6).tolist()))
        counts = np.bincount(np.searchsorted(edges, vals, side="right"), minlength=len(edges) + 1)
        feats[k] = {"edges": edges, "proportions": (counts / counts.sum()).round(6).tolist()}
    for k in CATEGORICAL:
        cats = sorted({r[k] for r in rows if r[k] is not None})
        counts = np.array([sum(1 for r in rows if r[k] == c) for c in cats] + [0], dtype=np.float64)
        feats[k] = {"categories": cats, "proportions": (counts / counts.sum()).round(6).tolist()}
    return {"source": "palmerpenguins training split", "rows": len(rows), "features": feats}


def train(out_dir, mlp_seed: int = SEED) -> dict:
    """Train, verify and write the model directory; returns a small summary dict.  ``mlp_seed``: the
    MLP's random_state (the split keeps ``SEED``): another seed is another model of the same data
    (the demo's version 2, scripts/demo_versions.py)."""
    import onnxruntime as ort
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = load_rows()
    y_all = [r[TARGET] for r in rows]
    train_rows, test_rows = train_test_split(rows, test_size=0.2, stratify=y_all, random_state=SEED)

    state = fit_state(train_rows)
    x_train, x_test = featurize(state, train_rows), featurize(state, test_rows)
    y_train = np.array([r[TARGET] for r in train_rows])
    y_test = np.array([r[TARGET] for r in test_rows])

    clf = MLPClassifier(hidden_layer_sizes=(16,), activation="relu", solver="lbfgs",
                        alpha=1e-3, max_iter=5000, random_state=mlp_seed)
    clf.fit(x_train, y_train)
    if clf.n_iter_ >= clf.max_iter:
        raise RuntimeError(f"MLP did not converge in {clf.max_iter} iterations")
    acc = float((clf.predict(x_test) == y_test).mean())
    print(f"tabular: train acc {float((clf.predict(x_train) == y_train).mean()):.4f}, "
          f"test acc {acc:.4f} ({len(y_test)} rows, {clf.n_iter_} lbfgs iterations)")

    model = export_onnx(clf, x_train.shape[1])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(["probabilities"], {"features": x_test})[0]
    diff = float(np.abs(got - clf.predict_proba(x_test)).max())
    if not diff <= ATOL:
        raise RuntimeError(f"ONNX export mismatch: max |onnx - predict_proba| = {diff:.3g} > {ATOL}")
    print(f"tabular: ONNX matches predict_proba on the test split (max abs diff {diff:.2e})")

    labels = [str(c) for c in clf.classes_]
    cases = []
    for inp, species in _reference_cases(test_rows):
        x = featurize(state, [inp])
        proba = clf.predict_proba(x)[0]
        onnx_proba = sess.run(["probabilities"], {"features": x})[0][0]
        if np.abs(onnx_proba - proba).max() > ATOL:
            raise RuntimeError(f"ONNX mismatch on reference case {inp}")
        cases.append({"input": inp, "expected_label": labels[int(np.argmax(proba))],
                      "expected_probabilities": [float(p) for p in onnx_proba],
                      "species": species})

    _write_json(out / "preprocess.json", state)
    _write_json(out / "labels.json", labels)
    _write_json(out / "reference.json", {"labels": labels, "cases": cases})
    _write_json(out / "drift.json", drift_reference(train_rows))
    tmp = out / "model.onnx.tmp"
    tmp.write_bytes(model.SerializeToString())
    os.replace(tmp, out / "model.onnx")
    return {"test_accuracy": acc, "max_abs_diff": diff, "n_features": int(x_train.shape[1])}


if __name__ == "__main__":
    train(sys.argv[1] if len(sys.argv) > 1 else "models/tabular/1")
