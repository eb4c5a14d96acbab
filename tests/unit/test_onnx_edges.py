"""What ONNX's own backend test models showed a zero-config model needs (docs/bench/onnx_test_models.py).

- a graph that checks its input values (split sizes that must add up) refuses the warm-up's made-up inputs:
  described by its graph it serves all the same, described by a model.yaml its load fails as before;
- empty axes (a Tril of a 3 x 0 x 5 input, ReduceSum's empty ``axes``) reach a graph-described model; a
  model.yaml's tensor model still refuses them;
- NaN and Inf reach a graph-described model (IsInf, IsNaN); a model.yaml's tensor model still refuses them;
- a fixed input bigger than the configured slot (ONNX's 1,000 x 1,000 MaxPool) sizes its pool's slots;
- OIP takes a scalar (shape []) for a model without batching;
- a graph without inputs (ONNX's test_constant) serves: a request sends none.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from aieng.gateway import codec
from aieng.gpu_executor.sessions import ModelSession
from aieng.models import repo
from aieng.models.inferred import inferred_spec, yaml_text
from aieng.processing.pre.tensor import TensorPreprocessor
from aieng.wire.protocol import RequestError, decode_tensor, encode_tensor
from tests.onnx_files import save_onnx

YAML = ("inputs: [{name: x, kind: tensor}, {name: parts, kind: tensor}]\n"
        "outputs: [{name: a, kind: tensor}, {name: b, kind: tensor}]\n"
        "preprocess: {type: tensor}\npostprocess: {type: tensor}\nbatching: {max_batch_size: 1}\n")


def split_graph(d, yaml: str | None = None):
    """``a, b = Split(x, parts)``: ``parts`` must add up to x's length, which ones (the warm-up's) do not."""
    graph = helper.make_graph(
        [helper.make_node("Split", ["x", "parts"], ["a", "b"], axis=0)], "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("parts", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["p"]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["q"])])
    save_onnx(d / "model.onnx", graph)
    if yaml is not None:
        (d / "model.yaml").write_text(yaml)


def test_a_graph_that_refuses_made_up_inputs_serves_described_by_its_graph(tmp_path):
    split_graph(tmp_path)
    sess = ModelSession(inferred_spec("s", "1", str(tmp_path), "model.onnx"), "cpu", 1)
    sess.warmup()  # ONNX Runtime refuses parts [1, 1] for x of 8: logged, not raised
    assert "Split" in sess.warm_error and sess.describe()["warm_up_failed"] == sess.warm_error
    a, b = sess.run({"x": np.arange(5, dtype=np.float32), "parts": np.array([2, 3], np.int64)})
    assert a.tolist() == [0, 1] and b.tolist() == [2, 3, 4]


def test_the_same_graph_described_by_a_model_yaml_fails_its_load_as_before(tmp_path):
    split_graph(tmp_path, YAML)
    sess = ModelSession(repo.load_spec("s", "1", str(tmp_path)), "cpu", 1)
    with pytest.raises(Exception, match="Split"):
        sess.warmup()


def tril_session(d, yaml: str | None = None) -> ModelSession:
    graph = helper.make_graph([helper.make_node("Trilu", ["x"], ["y"], upper=0)], "tril",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, "m", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, "m", 5])])
    save_onnx(d / "model.onnx", graph)
    if yaml is None:
        return ModelSession(inferred_spec("t", "1", str(d), "model.onnx"), "cpu", 1)
    (d / "model.yaml").write_text(yaml)
    return ModelSession(repo.load_spec("t", "1", str(d)), "cpu", 1)


def test_an_empty_axis_reaches_a_graph_described_model(tmp_path):
    sess = tril_session(tmp_path)
    assert sess.check_shapes([["x", "float32", [3, 0, 5]]]) is None
    (y,) = sess.run(sess.feeds_from([{"x": np.zeros((3, 0, 5), np.float32)}])[0])
    assert y.shape == (3, 0, 5)


def test_a_model_yaml_tensor_model_still_refuses_an_empty_axis(tmp_path):
    sess = tril_session(tmp_path, "inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
                                  "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
                                  "batching: {max_batch_size: 1}\n")
    assert sess.check_shapes([["x", "float32", [3, 0, 5]]]) == "input 'x' has an empty dimension"


def isinf_spec(d, yaml: str | None = None):
    graph = helper.make_graph([helper.make_node("IsInf", ["x"], ["y"])], "isinf",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, [4])])
    save_onnx(d / "model.onnx", graph)
    if yaml is None:
        return inferred_spec("i", "1", str(d), "model.onnx")
    (d / "model.yaml").write_text(yaml)
    return repo.load_spec("i", "1", str(d))


def test_nan_and_inf_reach_a_graph_described_model(tmp_path):
    x = np.array([1.0, np.inf, -np.inf, np.nan], np.float32)
    ((name, arr),), _, _ = TensorPreprocessor(isinf_spec(tmp_path)).process({"x": encode_tensor(x)})
    assert name == "x" and np.array_equal(arr, x, equal_nan=True)


def test_a_model_yaml_tensor_model_still_refuses_nan(tmp_path):
    spec = isinf_spec(tmp_path, "inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
                                "preprocess: {type: tensor}\npostprocess: {type: tensor}\n")
    with pytest.raises(RequestError, match="NaN or Inf"):
        TensorPreprocessor(spec).process({"x": encode_tensor(np.array([0, 0, 0, np.nan], np.float32))})


def pool_spec(d, shape, elem=TensorProto.FLOAT):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                              [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, shape)])
    save_onnx(d / "model.onnx", graph)
    return inferred_spec("p", "1", str(d), "model.onnx", measure=False)


@pytest.mark.parametrize("shape, elem, want", [
    ([1, 1, 1000, 1000], TensorProto.FLOAT, 4_000_000 + 64),  # unbatched: the whole shape
    (["batch", 2000, 1000], TensorProto.UINT8, 2_000_000 + 64),  # batched: one row
    ([1, "n"], TensorProto.FLOAT, 0),  # an open axis: the configured slots
    ([1, 4], TensorProto.STRING, 0),  # a string's size is its client's
])
def test_a_fixed_inputs_bytes_size_its_pools_slots(tmp_path, shape, elem, want):
    assert TensorPreprocessor(pool_spec(tmp_path, shape, elem)).max_request_bytes == want


def test_oip_takes_a_scalar_for_a_model_without_batching():
    t = codec.from_json("x", "FP32", [], [2.5])
    (row,) = codec.split_rows({"x": "tensor"}, [t], 1, batched=False)
    assert decode_tensor(row["x"]).shape == () and float(decode_tensor(row["x"])) == 2.5
    with pytest.raises(RequestError, match="a scalar, but the model batches"):
        codec.split_rows({"x": "tensor"}, [t], 8, batched=True)


def test_a_graph_without_inputs_serves_and_oip_takes_a_request_without_any(tmp_path):
    graph = helper.make_graph([helper.make_node("Constant", [], ["y"], value_floats=[1.0, 2.0])], "const", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    save_onnx(tmp_path / "model.onnx", graph)
    spec = inferred_spec("c", "1", str(tmp_path), "model.onnx")
    assert spec.inputs == () and not spec.batching.batched
    (tmp_path / "model.yaml").write_text(yaml_text(spec))  # `aieng models init` writes one that loads
    assert repo.load_spec("c", "1", str(tmp_path)).inputs == ()
    sess = ModelSession(spec, "cpu", 1)
    sess.warmup()
    assert sess.warm_error == "" and sess.run(sess.feeds_from([{}])[0])[0].tolist() == [1.0, 2.0]
    assert codec.split_rows({}, [], 1, batched=False) == [{}]
    with pytest.raises(RequestError, match="the request has no inputs"):
        codec.split_rows({"x": "tensor"}, [], 1, batched=False)
