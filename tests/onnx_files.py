"""ONNX files for the tests (and docs/bench), built with ``onnx.helper``: one writer and the graphs several
tests share.

``save_onnx(path, graph)`` writes a graph as a model (opset 17, IR 8: what this ONNX Runtime loads);
``save_add(dir, shape)`` is ``sum = a + b``; ``matmul_add(k)`` / ``save_matmul_add(dir, k)`` is model ``k`` of
the many-models repository: ``y = x @ W + b`` with its own weights, every fourth with a fixed first axis."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model_of(graph) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def save_onnx(path, graph) -> None:
    """``graph`` as the model file ``path`` (its directory made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model_of(graph), str(path))


def save_add(d, shape, elem=TensorProto.FLOAT, name: str = "model.onnx") -> None:
    """``sum = a + b`` with both inputs and the output of ``shape``, as ``d/name``."""
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["sum"])], "add",
                              [helper.make_tensor_value_info("a", elem, shape),
                               helper.make_tensor_value_info("b", elem, shape)],
                              [helper.make_tensor_value_info("sum", elem, shape)])
    save_onnx(os.path.join(str(d), name), graph)


def matmul_add(k: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Model ``k``'s weights: a ``[d_in, d_out]`` matrix of 1 KB .. ~100 KB and its bias, and whether it
    batches (every fourth does not: a fixed first axis of 1)."""
    rng = np.random.default_rng(k)
    d_in, d_out = 8 + (k * 7) % 56, 8 + (k * 13) % 400
    return (rng.standard_normal((d_in, d_out)).astype(np.float32),
            rng.standard_normal(d_out).astype(np.float32), k % 4 != 3)


def save_matmul_add(d, k: int) -> None:
    """Model ``k`` (``matmul_add``) as ``d/model.onnx``."""
    w, b, batched = matmul_add(k)
    lead = "batch" if batched else 1
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        f"m{k}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [lead, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [lead, w.shape[1]])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    save_onnx(Path(d) / "model.onnx", graph)


def transpose_graph():
    """``y = x`` with its last two axes swapped, ``x`` of shape ``[batch, 2, 3]``: a tensor model whose answer
    shows the order of the data it was given."""
    return helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], "transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 2])])
