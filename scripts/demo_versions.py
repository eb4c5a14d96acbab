"""Build the demo models' second versions and every demo version's golden set (idempotent).

Called by scripts/fetch_models.py (``build(repo, force)``) once version 1 of each model is in place;
also runnable alone: ``python scripts/demo_versions.py [--repo models] [--force]``.

* ``minilm/2/model.onnx``: version 1's int8 model re-saved by ONNX Runtime's offline graph
  optimisation (``SessionOptions.optimized_model_filepath``, ``ORT_ENABLE_BASIC``: constant folding and
  redundant-node elimination only, so the file stays portable across execution providers; EXTENDED
  would bake CPU-only fused kernels into it).  ``tokenizer.json`` is copied.  Checked: it loads on the
  CPU provider and its embeddings are within cosine 0.999 of version 1's.
* ``tabular/2/``: the same MLP retrained with another seed (``train_tabular.train(mlp_seed=7)``;
  same split, so the test accuracy is comparable).
* ``golden.json`` in every version directory (docs/models.md has the format), from **version 1's**
  real outputs (ONNX Runtime on version 1's model, the server's featuriser/tokeniser and pooling):
  minilm: each embedding, cosine >= 0.999; tabular version 1: label and probabilities (atol 1e-4);
  tabular version 2 (another model): the label only, on the cases version 1 is sure of (p >= 0.9).
  Each version is checked against its own golden set here (with the server's comparison,
  ``aieng.frontend.versions.hotswap.compare``): a version that would fail its golden set fails the script.
* Never writes ``model.yaml`` (committed: models/minilm/2/model.yaml, models/tabular/2/model.yaml).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

TEXTS = ["A man is playing a guitar.", "The new movie is awesome.", "ONNX Runtime serves models fast.",
         "short", "Penguins live in the southern hemisphere, mostly in Antarctica and nearby islands.",
         "I love sushi, but I do not like wasabi at all.", "Was ist das?", "1 2 3 4 5 6 7 8 9 10"]
TABULAR_MLP_SEED_V2 = 7


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# -- minilm ---------------------------------------------------------------------------------------
def embed(model: Path, tokenizer: Path, texts: list[str]) -> np.ndarray:
    """What the server answers: tokenised (max_length 128), run one text at a time, mean-pooled, L2."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    tok.enable_truncation(max_length=128)
    sess = _session(model)
    names = {i.name for i in sess.get_inputs()}
    out = []
    for text in texts:
        enc = tok.encode(text, add_special_tokens=True)
        feeds = {"input_ids": np.array([enc.ids], np.int64), "attention_mask": np.array([enc.attention_mask],
                                                                                       np.int64),
                 "token_type_ids": np.array([enc.type_ids], np.int64)}
        hidden = sess.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in names})[0][0]
        mask = np.array(enc.attention_mask, np.float32)[:, None]
        v = (hidden * mask).sum(0) / max(mask.sum(), 1e-9)
        out.append(v / max(np.linalg.norm(v), 1e-12))
    return np.array(out, np.float32)


def optimise_minilm(repo: Path, force: bool) -> None:
    import onnxruntime as ort

    src, dst = repo / "minilm" / "1", repo / "minilm" / "2"
    dst.mkdir(parents=True, exist_ok=True)
    if force or not (dst / "model.onnx").is_file():
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        tmp = dst / "model.onnx.tmp"
        opts.optimized_model_filepath = str(tmp)
        ort.InferenceSession(str(src / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        os.replace(tmp, dst / "model.onnx")
        print(f"minilm: optimised {src / 'model.onnx'} -> {dst / 'model.onnx'}")
    shutil.copyfile(src / "tokenizer.json", dst / "tokenizer.json")


def minilm_golden(repo: Path) -> None:
    from aieng.frontend.versions.golden import compare

    v1, v2 = repo / "minilm" / "1", repo / "minilm" / "2"
    e1 = embed(v1 / "model.onnx", v1 / "tokenizer.json", TEXTS)
    golden = {"outputs": {"embedding": {"min_cosine": 0.999}},
              "cases": [{"inputs": {"text": t}, "expected": {"embedding": e.tolist()}}
                        for t, e in zip(TEXTS, e1)]}
    e2 = embed(v2 / "model.onnx", v2 / "tokenizer.json", TEXTS)
    for i, case in enumerate(golden["cases"]):
        why = compare(golden, case["expected"], {"embedding": e2[i].tolist()})
        if why is not None:
            raise RuntimeError(f"minilm version 2 fails its golden set: case {i}: {why}")
    cos = float(np.min(np.sum(e1 * e2, axis=1)))
    for v in (v1, v2):
        _write_json(v / "golden.json", golden)
    print(f"minilm: golden sets written ({len(TEXTS)} cases); version 2 vs 1: min cosine {cos:.6f}, "
          f"max abs diff {float(np.abs(e1 - e2).max()):.2e}")


# -- tabular ----------------------------------------------------------------------------------------
def tabular_outputs(vdir: Path, rows: list[dict]) -> tuple[list[str], np.ndarray]:
    from train_tabular import featurize

    state = json.loads((vdir / "preprocess.json").read_text())
    labels = json.loads((vdir / "labels.json").read_text())
    probs = _session(vdir / "model.onnx").run(["probabilities"], {"features": featurize(state, rows)})[0]
    return [labels[int(i)] for i in probs.argmax(1)], probs


def tabular_versions(repo: Path, force: bool) -> None:
    from train_tabular import train

    from aieng.frontend.versions.golden import compare

    v1, v2 = repo / "tabular" / "1", repo / "tabular" / "2"
    if force or not (v2 / "model.onnx").is_file():
        train(v2, mlp_seed=TABULAR_MLP_SEED_V2)
    rows = [c["input"] for c in json.loads((v1 / "reference.json").read_text())["cases"]]
    labels1, probs1 = tabular_outputs(v1, rows)
    g1 = {"atol": 1e-4, "cases": [{"inputs": r, "expected": {"label": lab, "probabilities": p.tolist()}}
                                  for r, lab, p in zip(rows, labels1, probs1)]}
    sure = [(r, lab) for r, lab, p in zip(rows, labels1, probs1) if p.max() >= 0.9]
    g2 = {"cases": [{"inputs": r, "expected": {"label": lab}} for r, lab in sure]}
    labels2, _ = tabular_outputs(v2, [r for r, _ in sure])
    for i, case in enumerate(g2["cases"]):
        why = compare(g2, case["expected"], {"label": labels2[i]})
        if why is not None:
            raise RuntimeError(f"tabular version 2 fails its golden set: case {i}: {why}")
    _write_json(v1 / "golden.json", g1)
    _write_json(v2 / "golden.json", g2)
    print(f"tabular: golden sets written (version 1: {len(rows)} cases; version 2: {len(sure)} label cases)")


def build(repo: Path, force: bool = False) -> None:
    optimise_minilm(repo, force)
    minilm_golden(repo)
    tabular_versions(repo, force)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default="models")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    build(Path(args.repo), args.force)
