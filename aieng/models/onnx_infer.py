"""What an ONNX graph says about itself: its inputs and outputs, typed, and whether it has a batch axis.

``describe(path)`` reads the graph with the ``onnx`` package *without* external weight data (a model whose
weights live beside it in ``.data`` files is read in milliseconds, whatever its size) and returns a
``GraphInfo``: the graph's inputs (an initializer that is also listed as an input is a weight with a default,
not something a client sends: left out) and outputs, each a ``TensorInfo`` with its name, ONNX element type,
OIP datatype (``BOOL``, ``UINT8``..``UINT64``, ``INT8``..``INT64``, ``FP16``, ``FP32``, ``FP64``, ``BF16``,
``BYTES`` for strings; None for a type OIP has no name for), numpy dtype name where numpy has one, and shape:
per axis an int, or None where the graph names no size (``dims`` keeps the symbol, e.g. ``"batch"``); the
shape is None when the graph does not give the rank.

``GraphInfo.batch_axis()`` is the batching rule (Triton's auto-complete rule): the graph batches along its
first axis iff every input and every output has a first axis whose size the graph leaves open (a symbol,
``-1`` or unknown).  A fixed first axis, a scalar or an unknown rank anywhere means the graph is served
unbatched (Triton's ``max_batch_size: 0``): each request carries whole shapes.  The answer carries its reason.
"""
from __future__ import annotations

from dataclasses import dataclass

# ONNX TensorProto element type -> (ONNX name, OIP datatype, numpy dtype name).  OIP has no name for
# complex numbers or the float8/4-bit types; numpy has none for bfloat16 (ml_dtypes does) and holds strings
# as objects.
ELEMENT_TYPES: dict[int, tuple[str, str | None, str | None]] = {
    1: ("FLOAT", "FP32", "float32"),
    2: ("UINT8", "UINT8", "uint8"),
    3: ("INT8", "INT8", "int8"),
    4: ("UINT16", "UINT16", "uint16"),
    5: ("INT16", "INT16", "int16"),
    6: ("INT32", "INT32", "int32"),
    7: ("INT64", "INT64", "int64"),
    8: ("STRING", "BYTES", "object"),
    9: ("BOOL", "BOOL", "bool"),
    10: ("FLOAT16", "FP16", "float16"),
    11: ("DOUBLE", "FP64", "float64"),
    12: ("UINT32", "UINT32", "uint32"),
    13: ("UINT64", "UINT64", "uint64"),
    14: ("COMPLEX64", None, "complex64"),
    15: ("COMPLEX128", None, "complex128"),
    16: ("BFLOAT16", "BF16", None),
}


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output.  ``kind`` is ONNX's value kind: ``tensor`` for every type served; a
    sequence, map, optional or sparse tensor is described (kind set, types None) so the caller can refuse it
    by name."""
    name: str
    kind: str  # tensor, sequence, map, optional, sparse_tensor
    elem_type: int  # TensorProto.DataType; 0 when not a tensor
    onnx_type: str  # "FLOAT", "INT64", ...; "" when not a tensor
    datatype: str | None  # OIP datatype; None when OIP has no name for it
    np_dtype: str | None  # numpy dtype name; None when numpy has none
    shape: tuple[int | None, ...] | None  # None per open axis; None for an unknown rank
    dims: tuple[int | str | None, ...] | None  # as shape, with each symbol kept

    @property
    def first_axis_open(self) -> bool:
        """The graph leaves the first axis's size open (symbol, -1 or unknown)."""
        return bool(self.shape) and self.shape[0] is None

    def describe_dims(self) -> str:
        """``[batch, 3, 224, 224]``, ``[?, 8]``, ``[]`` or ``unknown rank``: for messages."""
        if self.dims is None:
            return "unknown rank"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"


@dataclass(frozen=True)
class BatchAxis:
    batched: bool
    why: str  # one sentence: the rule's verdict, naming the tensor that decided it


@dataclass(frozen=True)
class GraphInfo:
    path: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    opset: int  # the default domain's opset version; 0 when not given

    def batch_axis(self) -> BatchAxis:
        if not self.inputs:
            return BatchAxis(False, "the graph has no inputs")
        for side, tensors in (("input", self.inputs), ("output", self.outputs)):
            for t in tensors:
                if not t.first_axis_open:
                    if t.shape is None:
                        what = "has no known rank"
                    elif not t.shape:
                        what = "is a scalar"
                    else:
                        what = f"has a fixed first axis {t.describe_dims()}"
                    return BatchAxis(False, f"{side} {t.name} {what}: served unbatched, whole shapes")
        return BatchAxis(True, "every input and output has an open first axis: batched along it")


def _tensor(value) -> TensorInfo:
    """One ``ValueInfoProto``."""
    kind = value.type.WhichOneof("value") or ""
    kind = {"tensor_type": "tensor", "sequence_type": "sequence", "map_type": "map",
            "optional_type": "optional", "sparse_tensor_type": "sparse_tensor"}.get(kind, kind)
    if kind not in ("tensor", "sparse_tensor"):
        return TensorInfo(value.name, kind, 0, "", None, None, None, None)
    ttype = value.type.tensor_type if kind == "tensor" else value.type.sparse_tensor_type
    elem = int(ttype.elem_type)
    onnx_type, datatype, np_dtype = ELEMENT_TYPES.get(elem, (_elem_name(elem), None, None))
    shape = dims = None
    if ttype.HasField("shape"):
        sizes: list[int | None] = []
        named: list[int | str | None] = []
        for d in ttype.shape.dim:
            which = d.WhichOneof("value")
            if which == "dim_value" and d.dim_value >= 0:
                sizes.append(int(d.dim_value))
                named.append(int(d.dim_value))
            else:  # a symbol, a negative size (-1: some exporters' "any") or nothing at all
                sizes.append(None)
                named.append(d.dim_param if which == "dim_param" and d.dim_param else None)
        shape, dims = tuple(sizes), tuple(named)
    return TensorInfo(value.name, kind, elem, onnx_type, datatype, np_dtype, shape, dims)


def _elem_name(elem: int) -> str:
    from onnx import TensorProto
    try:
        return TensorProto.DataType.Name(elem)
    except ValueError:
        return f"type {elem}"


def describe_model(model, path: str = "") -> GraphInfo:
    """A loaded ``ModelProto``'s description (tests build one with ``onnx.helper``)."""
    graph = model.graph
    weights = ({init.name for init in graph.initializer}
               | {init.values.name for init in graph.sparse_initializer})
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return GraphInfo(path, tuple(_tensor(v) for v in graph.input if v.name not in weights),
                     tuple(_tensor(v) for v in graph.output), opset)


def describe(path: str) -> GraphInfo:
    """Read ``path``'s graph (no external data); ValueError naming the file when it is not an ONNX model."""
    import onnx  # at call time: only a scan that meets an undescribed ONNX file pays for the import

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # the protobuf parser's errors name no file
        raise ValueError(f"{path}: not a readable ONNX model ({exc})") from None
    return describe_model(model, path)
