"""``aieng quantize``: a new model version converted to INT8 or FP16, kept only if it matches the source.

* Reads ``<repo>/<model>/<version>/`` and writes ``<repo>/<model>/<out>/`` (default: the next free
  numeric version): the converted ONNX file, a copy of every other file of the source (not a stale
  ``parity.json``), ``model.yaml`` with ``converted_from: {version, hash, to, method}``, and
  ``parity.json`` (``aieng.tools.parity``: accuracy and speed against the source).
* INT8 ``static`` (QDQ, default for graphs with Conv) or ``dynamic`` (``quantize_dynamic``, otherwise);
  FP16 with ``keep_io_types=True``.  Why those defaults, measured: docs/models.md, 'Quantizing a model'.
* Tolerances: command line > the source model.yaml's ``quantize:`` > ``parity.DEFAULT_TOLERANCES``.
  Outside them nothing is written unless ``--force``.
* Atomic: built in a hidden directory under the repository (the server's scan skips names starting
  with ``.``) and renamed into place last; any failure removes it.
* Exit codes: 0 written, 1 refused on parity, 2 bad arguments or a conversion error.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import yaml

from aieng.models import yaml_file
from aieng.models.repo import ModelError, load_spec
from aieng.tools import parity
from aieng.tools.inprocess import allow_code

NOT_COPIED = {"model.yaml", "parity.json"}  # rewritten for the new version


class QuantizeError(RuntimeError):
    pass


def next_version(model_dir: str) -> str:
    """One more than the highest numeric entry of ``model_dir`` (any directory, with or without
    model.yaml, so a half-made version is never reused); ``1`` when there is none."""
    nums = [int(v) for v in os.listdir(model_dir) if v.isdigit()] if os.path.isdir(model_dir) else []
    return str(max(nums, default=0) + 1)


def default_method(onnx_path: str) -> str:
    import onnx

    ops = {n.op_type for n in onnx.load(onnx_path, load_external_data=False).graph.node}
    return "static" if "Conv" in ops else "dynamic"


def convert(spec, to: str, method: str, out_path: str, calib_feeds: list[dict], work: str) -> None:
    import onnx

    if to == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        onnx.save(convert_float_to_float16(onnx.load(spec.onnx_path), keep_io_types=True), out_path)
        return
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = os.path.join(work, "pre.onnx")
    # shape inference + constant folding first, as ONNX Runtime recommends; no sympy needed without
    # the symbolic pass
    quant_pre_process(spec.onnx_path, pre, skip_symbolic_shape=True)
    if method == "dynamic":
        quantize_dynamic(pre, out_path, weight_type=QuantType.QInt8)
        return

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([parity.stack(spec, [f]) for f in calib_feeds])

        def get_next(self):
            return next(self.it, None)

    quantize_static(pre, out_path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def new_model_yaml(cfg: dict, spec, to: str, method: str) -> dict:
    out = dict(cfg)
    how = f"{method} int8 quantization" if to == "int8" else "float16 conversion"
    out["description"] = f"{cfg.get('description', '')} [{how} of version {spec.version}]".strip()
    out["converted_from"] = {"version": spec.version, "hash": spec.content_hash, "to": to, "method": method}
    return out


def format_report(report: dict) -> str:
    lines = [f"{report['model']}:{report['source_version']} -> {report['version']} ({report['to']}, "
             f"{report['method']}), {report['samples']} samples, sizes {report['source_bytes']} -> "
             f"{report['new_bytes']} bytes"]
    for name, m in report["outputs"].items():
        acc = f"top-1 {m['top1']:.4f}" if m["metric"] == "top1" else f"min cosine {m['min_cosine']:.6f}"
        lines.append(f"  {name}: {acc}, mean cosine {m['mean_cosine']:.6f}, "
                     f"max abs diff {m['max_abs_diff']:.6g}")
    for r in report["speed"]:
        lines.append(f"  speed batch {r['batch']:>2} ({r['threads']} thread, median of {r['runs']}): source "
                     f"{r['source_ms']:.2f} ms, new {r['new_ms']:.2f} ms, ratio {r['ratio']:.2f}")
    tol = ", ".join(f"{k}={v}" for k, v in report["tolerances"].items())
    lines.append(f"  tolerances: {tol}")
    for f in report["failures"]:
        lines.append(f"  FAILED {f}")
    return "\n".join(lines)


def quantize(args: argparse.Namespace) -> tuple[dict, str | None]:
    """Build, measure, then rename into place or discard: (report, written directory or None)."""
    repo = args.repo or os.environ.get("AIENG_MODEL_REPOSITORY") or "models"
    src_dir = os.path.join(repo, args.model, args.version)
    try:
        spec = load_spec(args.model, args.version, src_dir, allow_code())
    except ModelError as exc:
        raise QuantizeError(str(exc)) from None
    try:
        cfg = yaml_file.load(os.path.join(src_dir, "model.yaml"))  # the one reader, with its limits
    except (OSError, ModelError) as exc:
        raise QuantizeError(str(exc)) from None
    try:
        tol = parity.resolve_tolerances(cfg, {"min_cosine": args.min_cosine, "min_top1": args.min_top1,
                                              "max_abs_diff": args.max_abs_diff})
    except ValueError as exc:
        raise QuantizeError(str(exc)) from None
    out_version = args.out_version or next_version(os.path.join(repo, args.model))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", out_version):
        raise QuantizeError(f"--out-version {out_version!r}: letters, digits, '.', '_', '-' only")
    final = os.path.join(repo, args.model, out_version)
    if os.path.exists(final):
        raise QuantizeError(f"{final} already exists")
    method = "float16" if args.to == "fp16" else (args.method or default_method(spec.onnx_path))

    tmp = tempfile.mkdtemp(prefix=f".quantize-{args.model}-{out_version}-", dir=repo)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would survive the rename
        feeds = parity.sample_feeds(spec, parity.sample_requests(spec, args.samples))
        calib = parity.sample_feeds(spec, parity.sample_requests(spec, args.samples, start=args.samples))
        for entry in os.listdir(src_dir):
            if entry in NOT_COPIED or os.path.join(src_dir, entry) == spec.onnx_path:
                continue
            src, dst = os.path.join(src_dir, entry), os.path.join(tmp, entry)
            (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, dst)
        new_onnx = os.path.join(tmp, os.path.relpath(spec.onnx_path, spec.path))
        os.makedirs(os.path.dirname(new_onnx), exist_ok=True)
        work = tempfile.mkdtemp(prefix=".work-", dir=repo)
        try:
            convert(spec, args.to, method, new_onnx, calib, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        with open(os.path.join(tmp, "model.yaml"), "w", encoding="utf-8") as fh:
            yaml.safe_dump(new_model_yaml(cfg, spec, args.to, method), fh, sort_keys=False,
                           allow_unicode=True)
        # the server must be able to load what is written
        load_spec(args.model, out_version, tmp, allow_code())

        ref = parity.run_each(parity.session(spec.onnx_path, args.threads), spec, feeds)
        new = parity.run_each(parity.session(new_onnx, args.threads), spec, feeds)
        metrics = parity.compare(spec, ref, new)
        big = min(8, spec.batching.max_batch_size)
        report = {
            "model": args.model, "source_version": args.version, "source_hash": spec.content_hash,
            "version": out_version, "to": args.to, "method": method, "samples": len(feeds),
            "source_bytes": os.path.getsize(spec.onnx_path), "new_bytes": os.path.getsize(new_onnx),
            "outputs": metrics, "tolerances": tol, "failures": parity.check(metrics, tol),
            "speed": parity.speed(spec, spec.onnx_path, new_onnx, feeds, args.threads,
                                  [1, big] if big > 1 else [1], args.speed_runs),
            "forced": False,
        }
        if report["failures"] and not args.force:
            return report, None
        report["forced"] = bool(report["failures"])
        with open(os.path.join(tmp, "parity.json"), "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
        if os.path.exists(final):
            raise QuantizeError(f"{final} appeared while converting")
        os.rename(tmp, final)
        return report, final
    except ModelError as exc:
        raise QuantizeError(f"the converted version does not load: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


def add_parser(sub) -> None:
    q = sub.add_parser("quantize", help="write an INT8/FP16 version of a model, checked against the source")
    q.add_argument("model")
    q.add_argument("version")
    q.add_argument("--to", choices=("int8", "fp16"), required=True)
    q.add_argument("--method", choices=("static", "dynamic"),
                   help="int8 only; default static for graphs with Conv, dynamic otherwise")
    q.add_argument("--samples", type=int, default=32, help="parity samples (as many again to calibrate)")
    q.add_argument("--repo", help="model repository (default AIENG_MODEL_REPOSITORY or ./models)")
    q.add_argument("--out-version", help="new version name (default: next free number)")
    q.add_argument("--min-cosine", type=float)
    q.add_argument("--min-top1", type=float)
    q.add_argument("--max-abs-diff", type=float)
    q.add_argument("--threads", type=int, default=1, help="intra-op threads for both files while timing")
    q.add_argument("--speed-runs", type=int, default=20, help="timed runs per file and batch size")
    q.add_argument("--force", action="store_true", help="write the version even outside the tolerances")
    q.set_defaults(func=main_quantize)


def main_quantize(args: argparse.Namespace) -> int:
    if args.samples < 1 or args.threads < 1 or args.speed_runs < 1:
        print("aieng quantize: --samples, --threads and --speed-runs must be >= 1", file=sys.stderr)
        return 2
    try:
        import onnx  # noqa: F401  (only ONNX Runtime's converters need it)
    except ImportError:
        print("aieng quantize: needs the onnx package: pip install 'aieng[quantize]'", file=sys.stderr)
        return 2
    try:
        report, written = quantize(args)
    except (QuantizeError, OSError, ValueError) as exc:
        print(f"aieng quantize: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a converter's own failure: one line, not a traceback
        print(f"aieng quantize: conversion failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    if written is None:
        print(f"refused: outside the tolerances, nothing written (use --force to write "
              f"{args.model}:{report['version']} anyway)", file=sys.stderr)
        return 1
    print(f"wrote {written}" + (" (forced past the tolerances)" if report["forced"] else ""))
    return 0
