"""Triton's QA models that its example clients call, rebuilt as small ONNX graphs in a model repository.

    simple                 INPUT0, INPUT1 INT32 [16] -> OUTPUT0 = sum, OUTPUT1 = difference; max batch 8
    simple_int8            the same in INT8
    simple_string          BYTES [16] holding decimal numbers -> their sum and difference, as BYTES
    simple_identity        INPUT0 BYTES [-1] -> OUTPUT0, the same
    custom_identity_int32  INPUT0 INT32 [-1] -> OUTPUT0, the same

Each is served with a hand-written tensor ``model.yaml`` (``describe=True``) or from its bare ONNX file.
"""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tests.onnx_files import model_of, save_onnx

MAX_BATCH = 8
TYPES = {"int32": TensorProto.INT32, "int8": TensorProto.INT8, "bytes": TensorProto.STRING}


def _io(name: str, dtype: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TYPES[dtype], ["batch", *dims])


def add_sub(dtype: str) -> onnx.GraphProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (strings: as int32 numbers, then back)."""
    nodes, a, b = [], "INPUT0", "INPUT1"
    if dtype == "bytes":
        nodes += [helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
                  helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32)]
        a, b = "a", "b"
        nodes += [helper.make_node("Add", [a, b], ["sum"]), helper.make_node("Sub", [a, b], ["diff"]),
                  helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
                  helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING)]
    else:
        nodes += [helper.make_node("Add", [a, b], ["OUTPUT0"]), helper.make_node("Sub", [a, b], ["OUTPUT1"])]
    return helper.make_graph(nodes, "add_sub", [_io("INPUT0", dtype, [16]), _io("INPUT1", dtype, [16])],
                             [_io("OUTPUT0", dtype, [16]), _io("OUTPUT1", dtype, [16])])


def identity(dtype: str) -> onnx.GraphProto:
    return helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
                             [_io("INPUT0", dtype, ["n"])], [_io("OUTPUT0", dtype, ["n"])])


MODELS = {  # name -> (graph, dtype, dims of each input and output)
    "simple": (lambda: add_sub("int32"), "int32", [16]),
    "simple_int8": (lambda: add_sub("int8"), "int8", [16]),
    "simple_string": (lambda: add_sub("bytes"), "bytes", [16]),
    "simple_identity": (lambda: identity("bytes"), "bytes", [-1]),
    "custom_identity_int32": (lambda: identity("int32"), "int32", [-1]),
}


def model_yaml(graph: onnx.GraphProto, dtype: str, dims: list) -> str:
    yaml_dtype = dtype  # "bytes": string tensors, as the dtypes work names them

    def side(items) -> str:
        return ", ".join(f"{{name: {t.name}, kind: tensor, dtype: {yaml_dtype}, shape: {dims}}}"
                         for t in items)

    return (f"inputs: [{side(graph.input)}]\noutputs: [{side(graph.output)}]\n"
            "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
            f"batching: {{max_batch_size: {MAX_BATCH}, max_wait_ms: 1}}\n")


def build(repo: Path, names: list[str] | None = None, describe: bool = True) -> Path:
    """Write the models (all, or ``names``) under ``repo/<name>/1/``; with ``describe``, a tensor
    ``model.yaml`` beside each ``model.onnx``."""
    for name in names or list(MODELS):
        make, dtype, dims = MODELS[name]
        graph = make()
        d = repo / name / "1"
        onnx.checker.check_model(model_of(graph))
        save_onnx(d / "model.onnx", graph)
        if describe:
            (d / "model.yaml").write_text(model_yaml(graph, dtype, dims))
    return repo
