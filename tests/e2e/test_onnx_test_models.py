"""ONNX's own backend test models (shipped in the ``onnx`` package), served zero-config from one server.

A representative subset of ``onnx/backend/test/data`` (the whole set, and ONNX's node tests, is
docs/bench/onnx_test_models.py's tally): scalar outputs, several inputs and outputs, fixed first axes, a
graph whose warm-up on made-up inputs fails (split sizes that must add up), float64, int64 and string
tensors, tensor names that are numbers or hold ``/``, a 4 MB input and a 2 MB output (bigger than the
default 1 MiB slot), six-dimensional tensors, two small classic networks.  Each goes into a repository as
``<name>/1/model.onnx``, nothing else; the server starts with ``--no-exit-on-error``, and each answer to
``test_data_set_0``'s inputs must equal ONNX's expected outputs (rtol 1e-3, atol 1e-4; integers, booleans
and strings exactly).  Beside them, graphs built here for what ONNX's node tests showed (NaN and Inf, an
empty axis, number and string scalars over OIP, a graph without inputs), and one model ONNX Runtime itself
cannot load, which must be refused alone, naming why.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ServerProcess
from tests.onnx_files import save_onnx

pytestmark = pytest.mark.e2e
DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"

SERVED = {  # name -> its directory under DATA, and what it covers
    "test_sequence_model1": ("simple", "three inputs of different first axes; an output with an open axis"),
    "test_sequence_model6": ("simple", "an int64 scalar output"),
    "test_sequence_model7": ("simple", "float64"),
    "test_sequence_model8": ("simple", "split sizes must add up: the warm-up's made-up inputs fail"),
    "test_expand_shape_model3": ("simple", "an int64 shape input"),
    "test_shrink": ("simple", "one fixed axis"),
    "test_single_relu_model": ("simple", "a fixed first axis of 1"),
    "test_strnorm_model_nostopwords_nochangecase": ("simple", "string tensors in and out"),
    "test_Conv2d": ("pytorch-converted", "tensors named by numbers"),
    "test_Conv3d_dilated_strided": ("pytorch-converted", "five dimensions"),
    "test_ConvTranspose2d": ("pytorch-converted", "an output bigger than its input"),
    "test_Embedding": ("pytorch-converted", "int64 in, float out"),
    "test_MaxPool2d_stride_padding_dilation": ("pytorch-converted", "a 4 MB input, over the 1 MiB slot"),
    "test_LogSoftmax": ("pytorch-converted", "a fixed first axis of 10"),
    "test_PixelShuffle": ("pytorch-converted", "a reshape"),
    "test_softmax_lastdim": ("pytorch-converted", "a 2 x 128 input"),
    "test_operator_chunk": ("pytorch-operator", "two outputs"),
    "test_operator_concat2": ("pytorch-operator", "two inputs"),
    "test_operator_conv": ("pytorch-operator", "a 2.6 MB input and a 1.9 MB output"),
    "test_operator_index": ("pytorch-operator", "an output of lower rank"),
    "test_operator_permute2": ("pytorch-operator", "six dimensions"),
    "test_operator_symbolic_override_nested": ("pytorch-operator", "three inputs, three outputs"),
    "test_operator_reduced_mean_keepdim": ("pytorch-operator", "a reduction"),
    "light_squeezenet": ("light", "a classic network (ONNX's own input: arange(n) / n)"),
    "light_shufflenet": ("light", "tensor names with '/'"),
}
# natural picks left out: ONNX Runtime itself cannot run them here (docs/bench/onnx_test_models.py)
EXCLUDED = {
    "test_AvgPool2d": "opset 1 AveragePool: ONNX Runtime has no kernel for it (NOT_IMPLEMENTED); served "
                      "below only to be refused",
    "test_BatchNorm2d_eval": "opset 6 BatchNormalization: no ONNX Runtime kernel",
    "test_PReLU_2d": "opset 6 PRelu: no ONNX Runtime kernel",
    "test_operator_add_broadcast": "opset 6 Add with broadcast attributes: no ONNX Runtime kernel",
    "test_strnorm_model_monday_casesensintive_lower": "StringNormalizer needs the en_US.UTF-8 locale",
    "test_gradient_of_add": "ai.onnx.preview.training Gradient: not an ONNX Runtime inference op",
}
REFUSED = "test_AvgPool2d"


def _tensor(path: Path) -> np.ndarray:
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def expected(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The inputs and expected outputs by graph name (input_K is the K-th input that is not a weight)."""
    kind = SERVED[name][0]
    path = DATA / kind / (f"{name}.onnx" if kind == "light" else f"{name}/model.onnx")
    model = onnx.load(str(path))
    weights = {i.name for i in model.graph.initializer}
    ins = [v for v in model.graph.input if v.name not in weights]
    outs = [v.name for v in model.graph.output]
    if kind == "light":  # ONNX's runner's input (generate_dummy_data) and its stored output
        dims = tuple(d.dim_value for d in ins[0].type.tensor_type.shape.dim)
        n = int(np.prod(dims))
        return ({ins[0].name: (np.arange(n).reshape(dims) / n).astype(np.float32)},
                {outs[0]: _tensor(path.with_name(f"{name}_output_0.pb"))})
    ds = path.parent / "test_data_set_0"
    return ({v.name: _tensor(ds / f"input_{k}.pb") for k, v in enumerate(ins)},
            {n: _tensor(ds / f"output_{k}.pb") for k, n in enumerate(outs)})


def _strs(a: np.ndarray) -> list:
    return [x.decode() if isinstance(x, bytes) else x for x in a.reshape(-1).tolist()]


def assert_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "OSU":
        assert _strs(got) == _strs(want), what
        return
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def build(repo: Path) -> None:
    for name, (kind, _) in SERVED.items():
        src = DATA / kind / (f"{name}.onnx" if kind == "light" else f"{name}/model.onnx")
        (repo / name / "1").mkdir(parents=True)
        shutil.copyfile(src, repo / name / "1" / "model.onnx")
    (repo / REFUSED / "1").mkdir(parents=True)
    shutil.copyfile(DATA / "pytorch-converted" / REFUSED / "model.onnx", repo / REFUSED / "1" / "model.onnx")
    f, b = TensorProto.FLOAT, TensorProto.BOOL
    save_onnx(repo / "isinf" / "1" / "model.onnx", helper.make_graph(  # NaN and Inf reach the graph
        [helper.make_node("IsInf", ["x"], ["inf"]), helper.make_node("IsNaN", ["x"], ["nan"])], "isinf",
        [helper.make_tensor_value_info("x", f, [4])],
        [helper.make_tensor_value_info("inf", b, [4]), helper.make_tensor_value_info("nan", b, [4])]))
    save_onnx(repo / "tril" / "1" / "model.onnx", helper.make_graph(  # an empty axis reaches the graph
        [helper.make_node("Trilu", ["x"], ["y"], upper=0)], "tril",
        [helper.make_tensor_value_info("x", f, [3, "m", 5])],
        [helper.make_tensor_value_info("y", f, [3, "m", 5])]))
    save_onnx(repo / "scalars" / "1" / "model.onnx", helper.make_graph(  # scalars in and out
        [helper.make_node("Mul", ["a", "b"], ["c"])], "scalars",
        [helper.make_tensor_value_info("a", f, []), helper.make_tensor_value_info("b", f, [])],
        [helper.make_tensor_value_info("c", f, [])]))
    save_onnx(repo / "constant" / "1" / "model.onnx", helper.make_graph(  # no inputs at all
        [helper.make_node("Constant", [], ["y"], value_ints=[7, 8])], "constant", [],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])]))
    save_onnx(repo / "word" / "1" / "model.onnx", helper.make_graph(  # a string scalar in and out
        [helper.make_node("Identity", ["s"], ["t"])], "word",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [])]))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("onnx-tests")
    build(tmp / "repo")
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(tmp / "repo"), AIENG_PREPROCESS_WORKERS="1",
                        AIENG_POSTPROCESS_WORKERS="1")
    srv.args = ["--no-exit-on-error"]
    srv.start(timeout=120)
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind"


@pytest.mark.parametrize("name", sorted(SERVED))
def test_each_answer_equals_onnxs_expected_output(server, name):
    inputs, outputs = expected(name)
    with server.client(timeout_s=60) as c:
        got = c.infer(name, inputs)["outputs"]
    assert sorted(got) == sorted(outputs)
    for out, want in outputs.items():
        assert_equal(got[out], want, f"{name} output {out}")


def test_a_warm_up_that_failed_on_made_up_inputs_shows_in_the_models_op(server):
    with server.client() as c:
        listed = c.models()["models"]
    assert "Split" in listed["test_sequence_model8"]["versions"]["1"]["onnx"]["warm_up_failed"]
    assert "warm_up_failed" not in listed["test_sequence_model6"]["versions"]["1"]["onnx"]


def test_a_model_onnx_runtime_cannot_load_is_refused_alone_naming_why(server):
    with server.client() as c:
        versions = c.models()["models"][REFUSED]["versions"]
        health = c.health()
    assert "NOT_IMPLEMENTED" in versions["1"]["load_error"] and "AveragePool" in versions["1"]["load_error"]
    assert health["ready"] is True


def test_nan_inf_and_an_empty_axis_reach_the_graph(server):
    x = np.array([1.0, np.inf, -np.inf, np.nan], np.float32)
    with server.client() as c:
        got = c.infer("isinf", {"x": x})["outputs"]
        empty = c.infer("tril", {"x": np.zeros((3, 0, 5), np.float32)})["outputs"]["y"]
    assert got["inf"].tolist() == [False, True, True, False]
    assert got["nan"].tolist() == [False, False, False, True]
    assert empty.shape == (3, 0, 5) and empty.dtype == np.float32


def test_scalars_in_and_out_natively_and_over_oip(server):
    """Numbers and strings over OIP HTTP, numbers over gRPC; ONNX's test_sequence_model6 (an int64 scalar
    length) over OIP HTTP."""
    import tritonclient.http as th

    a, b = np.array(1.5, np.float32), np.array(-4.0, np.float32)
    with server.client() as c:
        native = c.infer("scalars", {"a": a, "b": b})["outputs"]["c"]
    assert native.shape == () and float(native) == -6.0
    client = th.InferenceServerClient(server.oip_http)
    try:
        ins = [th.InferInput("a", [], "FP32"), th.InferInput("b", [], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        res = client.infer("scalars", ins)
        s = th.InferInput("s", [], "BYTES")
        s.set_data_from_numpy(np.array("naïve".encode(), dtype=object))
        word = client.infer("word", [s])
        seq_in, seq_out = expected("test_sequence_model6")
        x = th.InferInput("X", list(seq_in["X"].shape), "FP32")
        x.set_data_from_numpy(seq_in["X"])
        length = client.infer("test_sequence_model6", [x]).as_numpy("len")
    finally:
        client.close()
    assert res.get_output("c")["shape"] == [] and float(res.as_numpy("c")) == -6.0
    import tritonclient.grpc as tg

    g = tg.InferenceServerClient(server.oip_grpc)
    try:
        ins = [tg.InferInput("a", [], "FP32"), tg.InferInput("b", [], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        over_grpc = g.infer("scalars", ins)
    finally:
        g.close()
    assert list(over_grpc.get_output("c").shape) == [] and float(over_grpc.as_numpy("c")) == -6.0
    assert word.get_output("t")["shape"] == [] and word.as_numpy("t").tolist() == "naïve".encode()
    assert_equal(length, seq_out["len"], "test_sequence_model6 over OIP HTTP")


def test_a_graph_without_inputs_answers_a_request_without_any(server):
    import tritonclient.http as th

    with server.client() as c:
        native = c.infer("constant", {})["outputs"]["y"]
    client = th.InferenceServerClient(server.oip_http)
    try:
        over_http = client.infer("constant", []).as_numpy("y")
    finally:
        client.close()
    assert native.tolist() == [7, 8] and native.dtype == np.int64
    assert over_http.tolist() == [7, 8] and over_http.dtype == np.int64
