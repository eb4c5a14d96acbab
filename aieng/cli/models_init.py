"""``aieng models init PATH``: write the model.yaml that aieng infers for an ONNX file, for the user to edit.

PATH is a version directory (its ``model.onnx``, or its only ``*.onnx``) or an ONNX file; the model.yaml
goes beside the file (``model_file:`` names a file other than ``model.onnx``).  It is what the server would
serve with no model.yaml (``models/inferred.py``: inputs, outputs, batching, the measured batch cap) with
the reasons as comments, and it loads and serves the same.  An existing model.yaml is never overwritten:
``UsageError`` (one line, exit 2), as for any other mistake of the caller's.
"""
from __future__ import annotations

import argparse
import os

from aieng.tools.checks import UsageError


def init_model_yaml(path: str, measure: bool = True) -> tuple[str, str]:
    """``(model.yaml path, text)`` written for ``path``; ``ValueError`` saying why not."""
    from aieng.models.inferred import inferred_spec, onnx_file, yaml_text
    from aieng.models.spec import ModelError

    if os.path.isfile(path):
        vdir, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
        if not name.endswith(".onnx"):
            raise ValueError(f"{path} is not an .onnx file")
    elif os.path.isdir(path):
        vdir, name = os.path.abspath(path), onnx_file(path)
        if name is None:
            raise ValueError(f"{path} holds no model.onnx and not exactly one *.onnx: name the file")
    else:
        raise ValueError(f"{path}: no such file or directory")
    target = os.path.join(vdir, "model.yaml")
    if os.path.exists(target):
        raise ValueError(f"{target} exists: not overwritten (edit it, or move it away first)")
    try:
        spec = inferred_spec(os.path.basename(os.path.dirname(vdir)) or "model", os.path.basename(vdir),
                             vdir, name, measure=measure)
    except ModelError as exc:
        raise ValueError(str(exc)) from None
    text = yaml_text(spec)
    with open(target, "x", encoding="utf-8") as fh:  # "x": a file that appeared meanwhile is not replaced
        fh.write(text)
    return target, text


def main_init(args: argparse.Namespace) -> int:
    if not args.model:
        raise UsageError("models init needs PATH (a version directory or an .onnx file)")
    try:
        target, text = init_model_yaml(args.model, measure=not args.no_measure)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {target}:\n{text}", end="")
    return 0
