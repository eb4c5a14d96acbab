"""A Triton model repository served as it comes: ``<model>/config.pbtxt`` + ``<model>/1/model.onnx``, no
model.yaml, with Triton's own clients (tritonclient over HTTP and gRPC).

Triton's ``simple`` (INPUT0, INPUT1 INT32 [16] -> OUTPUT0 sum, OUTPUT1 difference, max_batch_size 8): values,
metadata and the model config answer; a model.yaml beside the config.pbtxt wins for its version; a malformed
config.pbtxt fails the start naming the file and the line; the repository load with a ``config`` override."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.triton_repo import SIMPLE_CONFIG, simple_graph, write_model
from tests.waits import until

pytestmark = pytest.mark.e2e


def _inputs(mod, a: np.ndarray, b: np.ndarray) -> list:
    out = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        t = mod.InferInput(name, list(arr.shape), "INT32")
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


@pytest.fixture
def simple_server(make_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "simple", SIMPLE_CONFIG)
    return make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1").start()


def test_simple_over_http_and_grpc(simple_server):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    with th.InferenceServerClient(simple_server.oip_http) as c:
        assert c.is_model_ready("simple")
        meta = c.get_model_metadata("simple")
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                                  {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}]
        assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        cfg = c.get_model_config("simple")
        assert cfg["max_batch_size"] == 8
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 3000
        assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == \
            [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
        assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == \
            [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
        res = c.infer("simple", _inputs(th, a, b))
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
        assert res.as_numpy("OUTPUT0").dtype == np.int32
    with tg.InferenceServerClient(simple_server.oip_grpc) as g:
        cfg = g.get_model_config("simple").config
        assert cfg.max_batch_size == 8 and [list(i.dims) for i in cfg.input] == [[16], [16]]
        res = g.infer("simple", _inputs(tg, a[:1], b[:1]))
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a[:1] + b[:1])
        np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a[:1] - b[:1])


def test_auto_complete_from_the_graph(make_server, tmp_path):
    """A config.pbtxt naming only the platform: inputs, outputs and batching come from the graph; the
    latest version only (Triton's default policy); a version with a model.yaml is described by it."""
    repo = tmp_path / "repo"
    write_model(repo, "auto", 'platform: "onnxruntime_onnx"\n', versions=("1", "2"))
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1").start()
    with th.InferenceServerClient(srv.oip_http) as c:
        assert c.is_model_ready("auto", "2") and not c.is_model_ready("auto", "1")
        cfg = c.get_model_config("auto")
        assert cfg["max_batch_size"] > 0
        assert {i["name"]: (i["data_type"], i["dims"]) for i in cfg["input"]} == \
            {"INPUT0": ("TYPE_INT32", [16]), "INPUT1": ("TYPE_INT32", [16])}
        a = np.ones((3, 16), dtype=np.int32)
        res = c.infer("auto", _inputs(th, a, 2 * a))
        np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), -a)


def test_malformed_config_fails_naming_file_and_line(make_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "simple", SIMPLE_CONFIG)
    write_model(repo, "broken", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput [ { name: "x" ]\n')
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1")
    with pytest.raises(RuntimeError) as err:
        srv.start(timeout=60)
    text = str(err.value)
    assert f"{repo / 'broken' / 'config.pbtxt'}:3:" in text and "malformed config.pbtxt" in text


def test_malformed_config_takes_down_only_its_model_when_the_start_is_not_strict(make_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "simple", SIMPLE_CONFIG)
    write_model(repo, "broken", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput [ { name: "x" ]\n')
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                      AIENG_STRICT_MODEL_LOAD="false").start()
    a = np.ones((1, 16), dtype=np.int32)
    with th.InferenceServerClient(srv.oip_http) as c:
        assert c.is_model_ready("simple") and not c.is_model_ready("broken")
        np.testing.assert_array_equal(c.infer("simple", _inputs(th, a, a)).as_numpy("OUTPUT0"), 2 * a)
    lines = [line for line in srv.output().splitlines() if "malformed config.pbtxt" in line]
    assert len(lines) == 1 and f"{repo / 'broken' / 'config.pbtxt'}:3:" in lines[0]


def test_other_platform_refused_by_name(make_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "plan", 'platform: "tensorrt_plan"\nmax_batch_size: 8\n')
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1")
    with pytest.raises(RuntimeError) as err:
        srv.start(timeout=60)
    assert "platform 'tensorrt_plan' (TensorRT)" in str(err.value)


def test_repository_load_with_a_config_override(make_server, tmp_path):
    """Triton's load with a JSON ``config``: the versions its version_policy names load with it instead of
    config.pbtxt; a loaded version is not reloaded in place (refused, saying so); a config that
    contradicts the graph fails the load naming the field, over HTTP and gRPC."""
    repo = tmp_path / "repo"
    write_model(repo, "simple", SIMPLE_CONFIG, versions=("1", "2"))
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                      AIENG_OIP_REPOSITORY_CONTROL="1").start()
    override = {"platform": "onnxruntime_onnx", "max_batch_size": 4,
                "version_policy": {"specific": {"versions": [1]}},
                "dynamic_batching": {"max_queue_delay_microseconds": 100}}
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with th.InferenceServerClient(srv.oip_http) as c:
        assert c.is_model_ready("simple", "2") and not c.is_model_ready("simple", "1")
        c.load_model("simple", config=json.dumps(override))
        assert c.is_model_ready("simple", "1")
        assert until(lambda: c.get_model_config("simple", "1")["max_batch_size"] == 4, 30)
        cfg1 = c.get_model_config("simple", "1")
        assert cfg1["dynamic_batching"]["max_queue_delay_microseconds"] == 100
        assert [i["dims"] for i in cfg1["input"]] == [[16], [16]]  # auto-completed from the graph
        assert c.get_model_config("simple", "2")["max_batch_size"] == 8
        res = c.infer("simple", _inputs(th, a, a), model_version="1")
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), 2 * a)
        with pytest.raises(InferenceServerException) as err:
            c.load_model("simple", config=json.dumps({**override,
                                                      "version_policy": {"latest": {"num_versions": 1}}}))
        assert "version 2 is loaded" in str(err.value)
    write_model(repo, "simple", None, versions=("3",))
    bad = {"max_batch_size": 8, "version_policy": {"specific": {"versions": [3]}},
           "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                     {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]}]}
    with tg.InferenceServerClient(srv.oip_grpc) as g:
        with pytest.raises(InferenceServerException) as err:
            g.load_model("simple", config=json.dumps(bad))
        assert "input[0].data_type TYPE_FP32 contradicts the graph's input 'INPUT0'" in str(err.value)
        assert not g.is_model_ready("simple", "3") and g.is_model_ready("simple", "2")


WARMUP = """model_warmup [{
  name: "w" batch_size: 2 count: 3
  inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [16] input_data_file: "in0" } }
  inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [16] random_data: true } }
}]
"""


def test_model_warmup_runs_before_ready(make_server, tmp_path):
    repo = tmp_path / "repo"
    mdir = write_model(repo, "simple", SIMPLE_CONFIG + WARMUP)
    (mdir / "warmup").mkdir()
    (mdir / "warmup" / "in0").write_bytes(np.arange(16, dtype="<i4").tobytes())
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1").start()
    assert "(3 of them model_warmup's samples)" in srv.output()
    with th.InferenceServerClient(srv.oip_http) as c:
        assert c.is_model_ready("simple")


def test_a_failing_warmup_sample_fails_the_load_naming_it(make_server, tmp_path):
    """A sample that fits the config but that the graph cannot run: an index out of its Gather's table
    (the server's own warm-up, which sends ones, runs)."""
    from onnx import TensorProto, helper

    table = helper.make_tensor("table", TensorProto.FLOAT, [10], [float(i) for i in range(10)])
    graph = helper.make_graph([helper.make_node("Gather", ["table", "idx"], ["y"])], "lookup",
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              initializer=[table])
    config = ('platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
              'model_warmup [{ name: "far" batch_size: 1 inputs { key: "idx" value { data_type: TYPE_INT64 '
              'dims: [4] input_data_file: "far" } } }]\n')
    repo = tmp_path / "repo"
    mdir = write_model(repo, "lookup", config, graph=graph)
    (mdir / "warmup").mkdir()
    (mdir / "warmup" / "far").write_bytes(np.array([1, 2, 3, 50], dtype="<i8").tobytes())
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1")
    with pytest.raises(RuntimeError) as err:
        srv.start(timeout=60)
    assert "model_warmup sample 'far' failed" in str(err.value)


def test_max_batch_size_0_whole_shapes(make_server, tmp_path):
    """A graph with a fixed first axis under Triton's max_batch_size 0: whole shapes in the metadata and
    the config, and the request's tensors run as sent."""
    repo = tmp_path / "repo"
    config = ('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
              'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [1, 16] }, '
              '{ name: "INPUT1" data_type: TYPE_INT32 dims: [1, 16] }]\n')
    write_model(repo, "fixed", config, graph=simple_graph(batch=1))
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1").start()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with th.InferenceServerClient(srv.oip_http) as c:
        assert c.get_model_metadata("fixed")["inputs"][0]["shape"] == [1, 16]
        cfg = c.get_model_config("fixed")
        assert cfg["max_batch_size"] == 0 and cfg["input"][0]["dims"] == [1, 16]
        np.testing.assert_array_equal(c.infer("fixed", _inputs(th, a, a)).as_numpy("OUTPUT1"), 0 * a)
    with tg.InferenceServerClient(srv.oip_grpc) as g:
        np.testing.assert_array_equal(g.infer("fixed", _inputs(tg, a, 3 * a)).as_numpy("OUTPUT0"), 4 * a)


def test_max_batch_size_1_keeps_the_batch_axis(make_server, tmp_path):
    """Triton's max_batch_size 1 is a batch axis of one row: the metadata and the config show it (dims
    without it, max_batch_size 1) and a client's [1, 16] tensors are one row each, as Triton takes them."""
    repo = tmp_path / "repo"
    write_model(repo, "one", SIMPLE_CONFIG.replace('name: "simple"', 'name: "one"')
                .replace("max_batch_size: 8", "max_batch_size: 1"))
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1").start()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with th.InferenceServerClient(srv.oip_http) as c:
        assert c.get_model_metadata("one")["inputs"][0]["shape"] == [-1, 16]
        cfg = c.get_model_config("one")
        assert (cfg["max_batch_size"], cfg["input"][0]["dims"]) == (1, [16])
        np.testing.assert_array_equal(c.infer("one", _inputs(th, a, a)).as_numpy("OUTPUT0"), 2 * a)
    with tg.InferenceServerClient(srv.oip_grpc) as g:
        np.testing.assert_array_equal(g.infer("one", _inputs(tg, a, 3 * a)).as_numpy("OUTPUT1"), -2 * a)


def test_reshape_between_the_declared_dims_and_the_graph(make_server, tmp_path):
    """Triton's ``reshape``: clients send and receive the declared dims ([16], and [1] for a per-row scalar)
    while the graph runs its own shapes ([4, 4], and a scalar per row); the config answer shows it, and a
    tensor of the graph's shape instead of the declared one is refused naming the input."""
    from onnx import TensorProto, helper

    repo = tmp_path / "repo"
    io = [helper.make_tensor_value_info(n, TensorProto.INT32, ["b", 4, 4]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, ["b", 4, 4]),
            helper.make_tensor_value_info("TOTAL", TensorProto.INT32, ["b"])]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("ReduceSum", ["OUTPUT0", "axes"], ["TOTAL"], keepdims=0)]
    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2])
    graph = helper.make_graph(nodes, "reshaped", io, outs, initializer=[axes])
    config = ('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
              'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] reshape { shape: [4, 4] } }, '
              '{ name: "INPUT1" data_type: TYPE_INT32 dims: [16] reshape { shape: [4, 4] } }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [16] reshape { shape: [4, 4] } }, '
              '{ name: "TOTAL" data_type: TYPE_INT32 dims: [1] reshape { shape: [] } }]\n')
    write_model(repo, "reshaped", config, graph=graph)
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1").start()
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    with th.InferenceServerClient(srv.oip_http) as c:
        meta = c.get_model_metadata("reshaped")
        assert [i["shape"] for i in meta["inputs"]] == [[-1, 16], [-1, 16]]
        assert [o["shape"] for o in meta["outputs"]] == [[-1, 16], [-1, 1]]
        cfg = c.get_model_config("reshaped")
        assert [(i["dims"], i["reshape"]["shape"]) for i in cfg["input"]] == [([16], [4, 4])] * 2
        answer = c.infer("reshaped", _inputs(th, a, a))
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), 2 * a)
        np.testing.assert_array_equal(answer.as_numpy("TOTAL"), (2 * a).sum(axis=1, keepdims=True))
        wrong = []
        for name in ("INPUT0", "INPUT1"):
            t = th.InferInput(name, [2, 4, 4], "INT32")
            t.set_data_from_numpy(a.reshape(2, 4, 4))
            wrong.append(t)
        with pytest.raises(InferenceServerException) as err:
            c.infer("reshaped", wrong)
        assert "INPUT0" in str(err.value) and "16" in str(err.value)
    with srv.client() as native:  # the executor's sample for its direct route is sent as a client sends
        pre = native.call({"op": "models"})["models"]["reshaped"]["versions"]["1"]["onnx"]["preprocess"]
    assert pre["where"].startswith("executor") and "measuring failed" not in pre["why"], pre
    with tg.InferenceServerClient(srv.oip_grpc) as g:
        answer = g.infer("reshaped", _inputs(tg, a, 3 * a))
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), 4 * a)
        assert answer.as_numpy("TOTAL").shape == (2, 1)
