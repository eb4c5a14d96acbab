"""models/onnx_infer.py on graphs built with onnx.helper: types, shapes, symbols, weights, the batch rule."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aieng.models.onnx_infer import describe, describe_model


def _model(inputs, outputs, nodes=(), initializers=()):
    graph = helper.make_graph(list(nodes), "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _add(shape, elem=TensorProto.FLOAT, out_shape=None):
    x = helper.make_tensor_value_info("x", elem, shape)
    y = helper.make_tensor_value_info("y", elem, shape)
    z = helper.make_tensor_value_info("z", elem, shape if out_shape is None else out_shape)
    return _model([x, y], [z], [helper.make_node("Add", ["x", "y"], ["z"])])


def test_symbolic_first_axis_batches_and_keeps_the_symbol(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_add(["batch", 4]), str(path))
    info = describe(str(path))
    assert [t.name for t in info.inputs] == ["x", "y"] and [t.name for t in info.outputs] == ["z"]
    x = info.inputs[0]
    assert (x.kind, x.elem_type, x.onnx_type, x.datatype, x.np_dtype) == (
        "tensor", 1, "FLOAT", "FP32", "float32")
    assert x.shape == (None, 4) and x.dims == ("batch", 4)
    assert info.opset == 17 and info.path == str(path)
    axis = info.batch_axis()
    assert axis.batched and "open first axis" in axis.why


def test_unknown_and_minus_one_first_axes_batch():
    m = _add([None, 3])
    assert describe_model(m).inputs[0].shape == (None, 3) and describe_model(m).inputs[0].dims == (None, 3)
    assert describe_model(m).batch_axis().batched
    m = _add([-1, 3])  # some exporters write -1 for "any"
    assert describe_model(m).inputs[0].shape == (None, 3)
    assert describe_model(m).batch_axis().batched


def test_fixed_first_axis_is_unbatched_and_names_the_tensor():
    axis = describe_model(_add([1, 4])).batch_axis()
    assert not axis.batched and "input x has a fixed first axis [1, 4]" in axis.why


def test_an_output_with_a_fixed_first_axis_decides_too():
    axis = describe_model(_add(["n", 4], out_shape=[2, 4])).batch_axis()
    assert not axis.batched and axis.why.startswith("output z has a fixed first axis [2, 4]")


def test_scalar_and_unknown_rank_are_unbatched():
    axis = describe_model(_add([])).batch_axis()
    assert not axis.batched and "is a scalar" in axis.why
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)  # no shape at all
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    info = describe_model(_model([x], [z], [helper.make_node("Identity", ["x"], ["z"])]))
    assert info.inputs[0].shape is None and info.inputs[0].dims is None
    assert info.inputs[0].describe_dims() == "unknown rank"
    axis = info.batch_axis()
    assert not axis.batched and "has no known rank" in axis.why


def test_no_inputs_is_unbatched():
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])
    value = helper.make_tensor("c", TensorProto.FLOAT, [2], [1, 2])
    const = helper.make_node("Constant", [], ["z"], value=value)
    axis = describe_model(_model([], [z], [const])).batch_axis()
    assert not axis.batched and axis.why == "the graph has no inputs"


def test_an_initializer_listed_as_an_input_is_a_weight_not_an_input():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 2])
    init = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    info = describe_model(_model([x, w], [z], [helper.make_node("Add", ["x", "w"], ["z"])], [init]))
    assert [t.name for t in info.inputs] == ["x"]
    assert info.batch_axis().batched  # the weight's fixed [2] does not count


def test_string_tensors_are_bytes():
    x = helper.make_tensor_value_info("x", TensorProto.STRING, ["n"])
    z = helper.make_tensor_value_info("z", TensorProto.STRING, ["n"])
    info = describe_model(_model([x], [z], [helper.make_node("Identity", ["x"], ["z"])]))
    t = info.inputs[0]
    assert (t.onnx_type, t.datatype, t.np_dtype, t.shape) == ("STRING", "BYTES", "object", (None,))


@pytest.mark.parametrize("elem,onnx_type,datatype,np_dtype", [
    (TensorProto.BOOL, "BOOL", "BOOL", "bool"),
    (TensorProto.UINT8, "UINT8", "UINT8", "uint8"),
    (TensorProto.UINT16, "UINT16", "UINT16", "uint16"),
    (TensorProto.UINT32, "UINT32", "UINT32", "uint32"),
    (TensorProto.UINT64, "UINT64", "UINT64", "uint64"),
    (TensorProto.INT8, "INT8", "INT8", "int8"),
    (TensorProto.INT16, "INT16", "INT16", "int16"),
    (TensorProto.INT32, "INT32", "INT32", "int32"),
    (TensorProto.INT64, "INT64", "INT64", "int64"),
    (TensorProto.FLOAT16, "FLOAT16", "FP16", "float16"),
    (TensorProto.FLOAT, "FLOAT", "FP32", "float32"),
    (TensorProto.DOUBLE, "DOUBLE", "FP64", "float64"),
    (TensorProto.BFLOAT16, "BFLOAT16", "BF16", None),
    (TensorProto.COMPLEX64, "COMPLEX64", None, "complex64"),
    (TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN", None, None),
])
def test_every_element_type(elem, onnx_type, datatype, np_dtype):
    t = describe_model(_add(["n", 2], elem=elem)).inputs[0]
    assert (t.elem_type, t.onnx_type, t.datatype, t.np_dtype) == (elem, onnx_type, datatype, np_dtype)


def test_a_sequence_input_is_described_not_typed():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    info = describe_model(_model([seq], [z], [helper.make_node("SequenceAt", ["s", "i"], ["z"])]))
    t = info.inputs[0]
    assert (t.kind, t.datatype, t.shape) == ("sequence", None, None)


def test_external_data_is_not_read(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 1024])
    init = numpy_helper.from_array(np.full(1024, 0.5, np.float32), "w")  # raw data: what moves out
    m = _model([x], [z], [helper.make_node("Add", ["x", "w"], ["z"])], [init])
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="weights.data", size_threshold=0)
    (tmp_path / "weights.data").unlink()  # describing must not need it
    info = describe(str(path))
    assert [t.name for t in info.inputs] == ["x"] and info.batch_axis().batched


def test_not_an_onnx_file_names_the_file(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\xff\xff\xff not protobuf")
    with pytest.raises(ValueError, match="model.onnx: not a readable ONNX model"):
        describe(str(path))
