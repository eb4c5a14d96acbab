"""A model version described by nothing but its ONNX graph: the spec built from the graph, and why.

``onnx_file(dir)`` names the ONNX file a version directory without a ``model.yaml`` serves (``model.onnx``,
else its only ``*.onnx``; None when there is none or several).  ``inferred_spec`` builds that version's
``ModelSpec`` as a tensor model (SHARED DECISIONS of issue 35): each graph input a ``kind: tensor`` input
and each output a ``kind: tensor`` output with its dtype and per-request shape, ``preprocess`` and
``postprocess`` ``tensor``.  Batching follows the graph (``onnx_infer.GraphInfo.batch_axis``): batched
along an open first axis, requests of equal shapes only (the graph says nowhere that padding is safe),
with the batch cap measured on the graph (``models/measure.py``); else unbatched (whole shapes, one request
per run).  ``Inferred`` records what was inferred and why, for ``aieng models``, the models op and the OIP
answers; ``yaml_text`` writes it as the model.yaml that ``aieng models init`` leaves for the user to edit.
"""
from __future__ import annotations

import glob
import os
from typing import Any

from aieng.models.frozen import NO_VALUE
from aieng.models.measure import CapMeasure, measure_cap
from aieng.models.onnx_infer import GraphInfo, TensorInfo, describe
from aieng.models.sections import (
    Batching,
    Inferred,
    InferredTensor,
    InputDecl,
    OutputDecl,
    Padding,
    Postprocess,
    Preprocess,
)
from aieng.models.spec import ModelError, ModelSpec, content_hash, version_dir

DEFAULT_FILE = "model.onnx"
MAX_WAIT_MS = 2.0  # as a model.yaml's default


def onnx_file(path: str) -> str | None:
    """The ONNX file a version directory serves without a model.yaml: ``model.onnx``, else the only
    ``*.onnx``; None when there is none, or several and none is ``model.onnx``."""
    if os.path.isfile(os.path.join(path, DEFAULT_FILE)):
        return DEFAULT_FILE
    found = [f for f in sorted(glob.glob(os.path.join(glob.escape(path), "*.onnx"))) if os.path.isfile(f)]
    return os.path.basename(found[0]) if len(found) == 1 else None


def _served(t: TensorInfo, batched: bool) -> InferredTensor:
    dtype = t.np_dtype or str(t.datatype).lower()
    if t.dims is None:  # the graph gives no rank (never batched): any shape, as Triton shows one
        return InferredTensor(t.name, str(t.datatype), dtype, (), (-1,))
    per = t.dims[1:] if batched else t.dims
    return InferredTensor(t.name, str(t.datatype), dtype, tuple(t.dims),
                          tuple(d if isinstance(d, int) else -1 for d in per))


def _decl(t: InferredTensor) -> dict[str, Any]:
    return {"name": t.name, "kind": "tensor", "dtype": t.dtype, "datatype": t.datatype,
            "shape": list(t.shape)}


def describe_version(path: str, onnx_name: str) -> GraphInfo:
    try:
        return describe(os.path.join(path, onnx_name))
    except ValueError as exc:
        raise ModelError(str(exc)) from None


def inferred_spec(name: str, version: str, path: str, onnx_name: str, measure: bool = True) -> ModelSpec:
    """The spec of a version served from its ONNX graph alone.  ``measure``: time the graph for its batch
    cap (``measure_cap``); False leaves the cap at 1 with the reason (``aieng models init`` on a machine
    that should not run the model)."""
    onnx_path = os.path.join(path, onnx_name)
    where = onnx_path
    info = describe_version(path, onnx_name)
    for t in info.inputs + info.outputs:
        if t.kind != "tensor" or t.datatype is None:
            raise ModelError(f"{where}: {'input' if t in info.inputs else 'output'} {t.name} is "
                             f"{t.onnx_type or t.kind}, a type aieng does not serve")
    axis = info.batch_axis()
    ins = tuple(_served(t, axis.batched) for t in info.inputs)
    outs = tuple(_served(t, axis.batched) for t in info.outputs)
    if not axis.batched:
        cap = CapMeasure(1, "unbatched: one request per run", ())
    elif measure:
        cap = measure_cap(onnx_path, info)
    else:
        cap = CapMeasure(1, "not measured (aieng models init --no-measure): set batching.max_batch_size", ())
    inferred = Inferred(onnx_name, ins, outs, axis.batched, axis.why, cap.max_batch_size, cap.why, cap.rows)
    inputs = tuple(InputDecl.parse(_decl(t)) for t in ins)
    outputs = tuple(OutputDecl.parse(_decl(t)) for t in outs)
    return ModelSpec(
        name=name, version=version, path=version_dir(path), content_hash=content_hash(path),
        description=f"inferred from {onnx_name}", inputs=inputs, outputs=outputs,
        preprocess=Preprocess("tensor"), postprocess=Postprocess.parse({"type": "tensor"}),
        padding=Padding(), batching=Batching(max_batch_size=cap.max_batch_size, max_wait_ms=MAX_WAIT_MS,
                                             max_padding_waste=0.0, batched=axis.batched,
                                             exact_shapes=True),
        timeout_ms=0, onnx_path=os.path.realpath(onnx_path), metadata=NO_VALUE, inferred=inferred,
        described_by="graph")


def yaml_text(spec: ModelSpec) -> str:
    """The model.yaml that describes ``spec`` as inferred (``aieng models init``): it loads and serves the
    same (``batching.batched``/``exact_shapes`` as inferred), with the reasons as comments to edit by."""
    inf = spec.inferred
    assert inf is not None
    lines = [f"# Written by `aieng models init` from {inf.onnx_file}'s graph; edit freely.",
             f"# batching: {inf.batching_why}", f"# max_batch_size: {inf.cap_why}"]
    if inf.measured:
        lines.append("# measured (rows: us per row): "
                     + ", ".join(f"{r}: {us:.1f}" for r, us in inf.measured))
    lines.append(f"description: {_quote(spec.description)}")
    if inf.onnx_file != DEFAULT_FILE:
        lines.append(f"model_file: {_quote(inf.onnx_file)}")

    def decl(items: tuple[InferredTensor, ...]) -> list[str]:
        return [f"  - {{name: {_quote(t.name)}, kind: tensor, dtype: {t.dtype}, datatype: {t.datatype}, "
                f"shape: {list(t.shape)}}}" for t in items]

    lines += ["inputs:" if inf.inputs else "inputs: []", *decl(inf.inputs), "outputs:", *decl(inf.outputs),
              "preprocess: {type: tensor}", "postprocess: {type: tensor}",
              f"batching: {{max_batch_size: {spec.batching.max_batch_size}, "
              f"max_wait_ms: {spec.batching.max_wait_ms}, max_padding_waste: 0.0, "
              f"batched: {str(spec.batching.batched).lower()}, exact_shapes: true}}"]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
