#!/usr/bin/env python3
"""What a load infers for ONNX files served without a model.yaml (issue 35: "The inferred cap and why, for
the demo models served without their model.yaml, and for at least three other public ONNX models you can
get from a package").

    .venv/bin/python docs/bench/inferred_caps.py [--only NAME,...] [FILE.onnx ...]

The files: each demo model's served ONNX file (``models/<name>/<version>/``, its model.yaml left behind), the
models that ship with onnxruntime (``onnxruntime/datasets/*.onnx``: logreg_iris, mul_1, sigmoid) and the
onnx package's light model zoo (``onnx/backend/test/data/light/*.onnx``: real architectures, resnet50,
squeezenet, shufflenet, densenet121, inception, vgg19, ... with light weights), and any FILE given.  Each is
linked into a temporary repository as ``<name>/1/model.onnx`` and read by ``aieng.models.repo.scan``, the
function a server's start runs (-> ``inferred.inferred_spec`` -> ``measure.measure_cap``), one model per
scan with the measuring budget of a start on that model alone.  Per file: the graph's inputs, whether it
batches and why, the cap and the measure's why with its microseconds per row, or why the load refuses it.
A file served unbatched for its fixed first axis (the light zoo's ``[1, 3, 224, 224]``) is also read with
that axis opened (``--no-open`` skips it): a copy whose inputs' and outputs' first axis is the symbol ``N``,
what re-exporting it with a dynamic batch axis gives (a graph that bakes its batch of 1 into a Reshape then
fails at 2 rows, and the measure says so).  A running server shows the same in ``aieng models`` and the OIP
model config.  The cap is a measurement:
it moves with the machine and its load (the load average is printed).
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from aieng.models import measure  # noqa: E402
from aieng.models.onnx_infer import describe  # noqa: E402
from aieng.models.repo import latest, scan  # noqa: E402
from aieng.models.spec import ModelError  # noqa: E402


def demo_files() -> dict[str, str]:
    """Each demo model's served ONNX file (a pipeline has none)."""
    out = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "models"))):
        try:
            versions = scan(os.path.join(ROOT, "models"), [name])[name]
        except ModelError:
            continue
        spec = versions[latest(versions)]
        if spec.onnx_path:
            out[f"demo {name}"] = spec.onnx_path
    return out


def package_files() -> dict[str, str]:
    import onnx
    import onnxruntime

    out = {}
    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "*.onnx")
    for pattern in (os.path.join(os.path.dirname(onnxruntime.__file__), "datasets", "*.onnx"), light):
        for path in sorted(glob.glob(pattern)):
            pkg = "onnxruntime" if "onnxruntime" in path else "onnx"
            out[f"{pkg} {os.path.basename(path)[:-5]}"] = path
    return out


def infer_one(label: str, path: str, tmp: str, name: str) -> list[str]:
    """The scan of ``path`` alone as the bare model ``name``: lines to print."""
    vdir = os.path.join(tmp, name, "1")
    os.makedirs(vdir)
    os.symlink(os.path.realpath(path), os.path.join(vdir, "model.onnx"))
    try:
        ins = ", ".join(f"{t.name} {t.onnx_type or t.kind} {t.describe_dims()}"
                        for t in describe(path).inputs)
    except ValueError as exc:
        ins = f"(unreadable: {exc})"
    lines = [f"## {label}", f"- file: {path}", f"- graph inputs: {ins}"]
    measure._SPENT[0] = 0.0  # a start on this model alone: the whole per-start measuring budget is its own
    t0 = time.perf_counter()
    try:
        spec = scan(tmp, [name])[name]["1"]
    except ModelError as exc:
        return lines + [f"- not served: {exc}"]
    inf = spec.inferred
    assert inf is not None
    lines += [f"- batched: {'yes' if inf.batched else 'no'}: {inf.batching_why}",
              f"- cap: {spec.batching.max_batch_size}: {inf.cap_why} (scan {time.perf_counter() - t0:.1f} s)"]
    if inf.measured:
        lines.append("- us per row: " + ", ".join(f"{r}: {us:.1f}" for r, us in inf.measured))
    return lines


def opened(path: str, out: str) -> bool:
    """Write ``path`` to ``out`` with every input's and output's first axis the symbol ``N`` (intermediate
    shapes dropped, ONNX Runtime infers them again); False when one has no first axis."""
    import onnx

    model = onnx.load(path)
    weights = {t.name for t in model.graph.initializer}  # an old graph lists its weights among its inputs
    for v in [i for i in model.graph.input if i.name not in weights] + list(model.graph.output):
        dims = v.type.tensor_type.shape.dim
        if not dims:
            return False
        dims[0].Clear()
        dims[0].dim_param = "N"
    del model.graph.value_info[:]
    onnx.save(model, out)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="more ONNX files")
    ap.add_argument("--only", help="comma-separated substrings: only files whose label has one")
    ap.add_argument("--no-open", action="store_true",
                    help="do not also read a fixed-first-axis file with that axis opened")
    args = ap.parse_args(argv)
    files = {**demo_files(), **package_files(), **{f"file {os.path.basename(f)}": f for f in args.files}}
    if args.only:
        keep = [s for s in args.only.split(",") if s]
        files = {k: v for k, v in files.items() if any(s in k for s in keep)}
    print(f"load average at the start: {os.getloadavg()[0]:.2f}; {len(files)} files; measured on one thread, "
          f"1..{measure.CAP} rows, {measure.BUDGET_S:g} s budget each\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="aieng-caps-") as tmp:
        for i, (label, path) in enumerate(files.items()):
            lines = infer_one(label, path, tmp, f"m{i}")
            print("\n".join(lines) + "\n", flush=True)
            copy = os.path.join(tmp, f"open{i}.onnx")
            if (not args.no_open and any("has a fixed first axis" in line for line in lines)
                    and opened(path, copy)):
                print("\n".join(infer_one(f"{label}, first axis opened", copy, tmp, f"o{i}")) + "\n",
                      flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
