"""Triton model repositories for the tests: ``<repo>/<model>/config.pbtxt`` and
``<repo>/<model>/<v>/model.onnx``, graphs built with ``onnx.helper``.  ``simple`` is Triton's QA model:
INPUT0, INPUT1 INT32 [16] -> OUTPUT0 the sum, OUTPUT1 the difference, ``max_batch_size: 8``."""
from __future__ import annotations

from pathlib import Path

from tests.onnx_files import save_onnx

SIMPLE_CONFIG = """name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
dynamic_batching { max_queue_delay_microseconds: 3000 }
"""


def simple_graph(elem: int | None = None, batch: str | int = "batch", width: int = 16):
    """Triton's ``simple`` as an ONNX graph (INT32 by default; ``batch``: the first axis, symbol or size)."""
    from onnx import TensorProto, helper

    elem = TensorProto.INT32 if elem is None else elem
    io = [helper.make_tensor_value_info(n, elem, [batch, width]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, elem, [batch, width]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    return helper.make_graph(nodes, "simple", io, outs)


def write_model(repo: Path, name: str, config: str | None, graph=None, versions=("1",),
                filename: str = "model.onnx") -> Path:
    """``<repo>/<name>/config.pbtxt`` (``config``; None: none) and each version's ONNX file."""
    mdir = repo / name
    mdir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (mdir / "config.pbtxt").write_text(config)
    for v in versions:
        save_onnx(mdir / v / filename, graph if graph is not None else simple_graph())
    return mdir
