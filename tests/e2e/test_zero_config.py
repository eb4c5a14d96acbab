"""Zero-config ONNX (issue 35 item 1): a repository of bare ONNX files, built here with onnx.helper, served
with no model.yaml, and called as clients would: the native client and tritonclient over HTTP and gRPC.

- ``adder``: ``sum = a + b`` on FP32 ``[batch, 4]`` (a symbolic batch axis: batched, its cap measured);
- ``fixed``: the same on ``[1, 4]`` (a fixed first axis: unbatched, whole shapes, Triton's max_batch_size 0);
- ``nobatch``: INT32 ``[3]`` (no batch axis at all);
- ``mean``: ``ReduceMean`` over the last two axes of FP32 ``[batch, len, width]``: requests of different
  shapes must never be padded into one batch (a zero pad changes the mean);
- ``handfixed``: a hand-written model.yaml (batching as every model.yaml defaults it: 8) on a ``[1, 4]``
  graph, which failed its warm-up before (``Got: 8 Expected: 1``) and now serves unbatched;
- ``kserve``: ``--model-dir`` a directory holding just ``model.onnx`` (KServe's /mnt/models), and a model
  directory of versions each holding only an ONNX file.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto, helper

from aieng.cli.rollout import call
from aieng.client import AsyncClient
from tests.conftest import ROOT, ServerProcess
from tests.onnx_files import save_add, save_onnx

pytestmark = pytest.mark.e2e


def save(d, nodes, inputs, outputs, name: str = "model.onnx") -> None:
    save_onnx(os.path.join(str(d), name), helper.make_graph(nodes, "g", inputs, outputs))


def save_mean(d, work: int = 0) -> None:
    """``m = mean(x)`` over the last two axes of FP32 ``x[batch, len, width]``.  ``work`` > 0 adds, once per
    run whatever its rows, a ``work x work`` matrix product made from the first row and multiplied by 0:
    a run long enough for requests to queue behind it, cheaper per row the more rows it has (so the
    batcher batches), without changing any answer."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m" if not work else "mean"], axes=[1, 2], keepdims=0)]
    if work:
        shape = helper.make_tensor("shape", TensorProto.INT64, [2], [work, work])
        zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
        first = helper.make_tensor("first", TensorProto.INT64, [], [0])
        nodes += [helper.make_node("Constant", [], ["shape"], value=shape),
                  helper.make_node("Constant", [], ["zero"], value=zero),
                  helper.make_node("Constant", [], ["first"], value=first),
                  helper.make_node("Gather", ["x", "first"], ["row"], axis=0),
                  helper.make_node("ReduceMean", ["row"], ["seed"], axes=[0, 1], keepdims=1),
                  helper.make_node("Expand", ["seed", "shape"], ["big"]),
                  helper.make_node("MatMul", ["big", "big"], ["prod"]),
                  helper.make_node("ReduceMax", ["prod"], ["most"], keepdims=0),
                  helper.make_node("Mul", ["most", "zero"], ["nothing"]),
                  helper.make_node("Add", ["mean", "nothing"], ["m"])]
    save(d, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "len", "width"])],
         [helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch"])])


def build_repo(repo) -> None:
    save_add(repo / "adder" / "1", ["batch", 4])
    save_add(repo / "fixed" / "1", [1, 4])
    save_add(repo / "nobatch" / "1", [3], TensorProto.INT32)
    save_mean(repo / "mean" / "1")
    save_add(repo / "handfixed" / "1", [1, 4])
    (repo / "handfixed" / "1" / "model.yaml").write_text(
        "inputs: [{name: a, kind: tensor}, {name: b, kind: tensor}]\noutputs: [{name: sum, kind: tensor}]\n"
        "preprocess: {type: tensor}\npostprocess: {type: tensor}\n")
    (repo / "empty" / "1").mkdir(parents=True)  # neither model.yaml nor ONNX file: not a model, as before


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zero")
    build_repo(tmp / "repo")
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(tmp / "repo"), AIENG_PREPROCESS_WORKERS="1",
                        AIENG_POSTPROCESS_WORKERS="1").start()
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def f32(*shape, start: float = 0.0) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float32) + start).reshape(shape)


def test_models_op_shows_what_was_inferred_and_why(server):
    with server.client() as c:
        models = c.models()["models"]
    assert sorted(models) == ["adder", "fixed", "handfixed", "mean", "nobatch"]
    adder = models["adder"]["versions"]["1"]
    inf = adder["inferred"]
    assert inf["batched"] and "open first axis" in inf["batching_why"]
    assert inf["cap_why"].startswith("measured at load") and "1" in inf["measured_us_per_row"]
    assert adder["max_batch_size"] == inf["max_batch_size"] >= 1
    assert adder["inputs"][0] == {"name": "a", "kind": "tensor", "dtype": "float32", "datatype": "FP32",
                                  "shape": [4]}
    fixed = models["fixed"]["versions"]["1"]
    assert fixed["max_batch_size"] == 0 and not fixed["inferred"]["batched"]
    assert "fixed first axis [1, 4]" in fixed["inferred"]["batching_why"]
    assert fixed["onnx"]["batched"] is False and fixed["onnx"]["inputs"][0]["shape"] == [1, 4]
    hand = models["handfixed"]["versions"]["1"]
    assert "inferred" not in hand and hand["onnx"]["batched"] is False  # the session decided
    listed = call(server.admin_addr, "models")["models"]  # `aieng models list`
    assert listed["fixed"]["versions"]["1"]["inferred"]["batching_why"] == fixed["inferred"]["batching_why"]
    assert "inferred" not in listed["handfixed"]["versions"]["1"]


def test_native_client_answers(server):
    with server.client() as c:
        out = c.infer("adder", {"a": f32(4), "b": f32(4, start=10)})["outputs"]["sum"]
        np.testing.assert_array_equal(out, f32(4) + f32(4, start=10))
        out = c.infer("fixed", {"a": f32(1, 4), "b": f32(1, 4, start=1)})["outputs"]["sum"]
        assert out.shape == (1, 4)
        np.testing.assert_array_equal(out, f32(1, 4) + f32(1, 4, start=1))
        a, b = np.array([1, -2, 3], np.int32), np.array([40, 50, 60], np.int32)
        out = c.infer("nobatch", {"a": a, "b": b})["outputs"]["sum"]
        assert out.dtype == np.int32 and out.tolist() == [41, 48, 63]
        out = c.infer("handfixed", {"a": f32(1, 4), "b": f32(1, 4)})["outputs"]["sum"]
        np.testing.assert_array_equal(out, 2 * f32(1, 4))
        with pytest.raises(Exception, match="must have shape"):  # a lying shape fails its own request
            c.infer("fixed", {"a": f32(2, 4), "b": f32(2, 4)})


def test_requests_of_different_shapes_are_never_padded_together(make_server, tmp_path):
    """Many ``mean`` requests of shapes [32, 1..6] in flight at once (one batching length, 32: the one the
    warm-up times at 1, 2 and 4 rows, so the batcher knows a batch pays): each answer is its own
    request's mean (one padded with zeros to a wider neighbour's width would give a smaller mean), and
    equal shapes still batch together. One lane and a run of a few milliseconds make the requests queue.
    The test fails when the executor pads them together."""
    save_mean(tmp_path / "repo" / "mean" / "1", work=512)
    srv = make_server(AIENG_MODEL_REPOSITORY=str(tmp_path / "repo"), AIENG_PREPROCESS_WORKERS="1",
                      AIENG_POSTPROCESS_WORKERS="1", AIENG_EXECUTOR_LANES="1",
                      AIENG_EXECUTOR_SPARE_LANE="0", AIENG_IDLE_WIDE_RUNS="0").start()
    rows = [(np.arange(32 * w, dtype=np.float32).reshape(32, w) % 7) + k
            for k in range(96) for w in (k % 6 + 1,)]

    async def together():
        client = AsyncClient(srv.addr)
        try:
            return await asyncio.gather(*(client.infer("mean", {"x": x}) for x in rows))
        finally:
            client.close()

    batches = []
    for _ in range(5):  # a burst may meet the batcher still learning its costs: a few, until one batches
        replies = asyncio.run(together())
        assert [float(r["outputs"]["m"]) for r in replies] == pytest.approx([float(x.mean()) for x in rows],
                                                                            rel=1e-5)
        batches.append(max(r["batch"] for r in replies))
        if batches[-1] > 1:
            break
    assert batches[-1] > 1, f"the server never batched ({batches}): the test proves nothing"


def test_tritonclient_http_metadata_config_and_infer(server):
    with th.InferenceServerClient(server.oip_http) as c:
        cap = c.get_model_config("adder")["max_batch_size"]
        meta = c.get_model_metadata("adder")
        lead = [-1] if cap > 0 else []
        assert meta["inputs"] == [{"name": n, "datatype": "FP32", "shape": lead + [4]} for n in ("a", "b")]
        cfg = c.get_model_config("adder")
        assert cfg["input"][0]["dims"] == [4] and cfg["input"][0]["data_type"] == "TYPE_FP32"
        assert "open first axis" in cfg["parameters"]["aieng.batching"]["string_value"]
        assert cfg["parameters"]["aieng.max_batch_size"]["string_value"].startswith("measured at load")
        rows = max(1, min(3, cap))
        x, y = f32(rows, 4), f32(rows, 4, start=100)
        ins = [th.InferInput("a", lead and [rows, 4] or [4], "FP32"),
               th.InferInput("b", lead and [rows, 4] or [4], "FP32")]
        ins[0].set_data_from_numpy(x if lead else x[0])
        ins[1].set_data_from_numpy(y if lead else y[0])
        np.testing.assert_array_equal(c.infer("adder", ins).as_numpy("sum"), (x + y) if lead else (x + y)[0])

        for name in ("fixed", "handfixed"):  # unbatched: Triton's max_batch_size 0, whole shapes
            meta = c.get_model_metadata(name)
            assert meta["inputs"][0] == {"name": "a", "datatype": "FP32", "shape": [1, 4]}
            assert meta["outputs"] == [{"name": "sum", "datatype": "FP32", "shape": [1, 4]}]
            cfg = c.get_model_config(name)
            assert cfg["max_batch_size"] == 0 and cfg["input"][0]["dims"] == [1, 4]
            ins = [th.InferInput("a", [1, 4], "FP32"), th.InferInput("b", [1, 4], "FP32")]
            ins[0].set_data_from_numpy(f32(1, 4))
            ins[1].set_data_from_numpy(f32(1, 4, start=5), binary_data=False)  # JSON data too
            np.testing.assert_array_equal(c.infer(name, ins).as_numpy("sum"), f32(1, 4) + f32(1, 4, start=5))
        fixed_cfg = c.get_model_config("fixed")
        assert "fixed first axis" in fixed_cfg["parameters"]["aieng.batching"]["string_value"]

        meta = c.get_model_metadata("nobatch")
        assert meta["inputs"][0] == {"name": "a", "datatype": "INT32", "shape": [3]}
        ins = [th.InferInput("a", [3], "INT32"), th.InferInput("b", [3], "INT32")]
        ins[0].set_data_from_numpy(np.array([1, 2, 3], np.int32))
        ins[1].set_data_from_numpy(np.array([7, 7, 7], np.int32))
        out = c.infer("nobatch", ins).as_numpy("sum")
        assert out.dtype == np.int32 and out.tolist() == [8, 9, 10]


def test_tritonclient_grpc_infer(server):
    with tg.InferenceServerClient(server.oip_grpc) as g:
        cfg = g.get_model_config("fixed", as_json=True)["config"]
        assert cfg.get("max_batch_size", 0) == 0 and [int(d) for d in cfg["input"][0]["dims"]] == [1, 4]
        ins = [tg.InferInput("a", [1, 4], "FP32"), tg.InferInput("b", [1, 4], "FP32")]
        ins[0].set_data_from_numpy(f32(1, 4))
        ins[1].set_data_from_numpy(f32(1, 4, start=2))
        np.testing.assert_array_equal(g.infer("fixed", ins).as_numpy("sum"), f32(1, 4) + f32(1, 4, start=2))
        x = np.array([[1.0, 2.0, 6.0], [3.0, 3.0, 3.0]], np.float32)
        if g.get_model_config("mean").config.max_batch_size:
            x = x[None]
        t = tg.InferInput("x", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        assert g.infer("mean", [t]).as_numpy("m").ravel().tolist() == [3.0]


def serve_mount(make_server, mnt):
    """``aieng serve --model-name simple --model-dir MNT``, started."""
    srv = make_server(AIENG_PREPROCESS_WORKERS="1", AIENG_POSTPROCESS_WORKERS="1")
    srv.args = ["--model-name", "simple", "--model-dir", str(mnt)]
    return srv.start()


def test_model_dir_holding_just_model_onnx_serves(make_server, tmp_path):
    """DIR holding just model.onnx: what KServe's storage initializer leaves in /mnt/models."""
    mnt = tmp_path / "mnt" / "models"
    save_add(mnt, ["batch", 4])
    srv = serve_mount(make_server, mnt)
    with srv.client() as c:
        assert sorted(c.models()["models"]["simple"]["versions"]) == ["1"]
        out = c.infer("simple", {"a": f32(4), "b": f32(4)}, version="1")["outputs"]["sum"]
        np.testing.assert_array_equal(out, 2 * f32(4))
    with th.InferenceServerClient(srv.oip_http) as h:
        assert h.is_model_ready("simple")


def test_model_dir_of_versions_serves_each_onnx_file(make_server, tmp_path):
    """DIR/<version>/ each holding only an ONNX file (version 2's only *.onnx is not named model.onnx)."""
    mnt = tmp_path / "mnt" / "models"
    save_add(mnt / "1", ["batch", 4])
    save_add(mnt / "2", [1, 4], name="net.onnx")
    srv = serve_mount(make_server, mnt)
    with srv.client() as c:
        versions = c.models()["models"]["simple"]["versions"]
        assert sorted(versions) == ["1", "2"]
        assert versions["2"]["inferred"]["onnx_file"] == "net.onnx"
        out = c.infer("simple", {"a": f32(4), "b": f32(4)}, version="1")["outputs"]["sum"]
        np.testing.assert_array_equal(out, 2 * f32(4))
        out = c.infer("simple", {"a": f32(1, 4), "b": f32(1, 4)}, version="2")["outputs"]["sum"]
        np.testing.assert_array_equal(out, 2 * f32(1, 4))
    with th.InferenceServerClient(srv.oip_http) as h:
        assert h.is_model_ready("simple")


def test_model_dir_without_a_model_fails_with_one_line(tmp_path):
    empty = tmp_path / "mnt"
    empty.mkdir()
    (empty / "README").write_text("no model here\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    proc = subprocess.run([sys.executable, "-m", "aieng.cli", "serve", "--model-name", "x", "--model-dir",
                           str(empty)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "holds no model.yaml and no ONNX file" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_models_init_writes_a_model_yaml_that_serves_the_same(make_server, tmp_path):
    repo = tmp_path / "repo"
    save_add(repo / "adder" / "1", ["batch", 4])
    save_add(repo / "fixed" / "1", [1, 4], name="fixed.onnx")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}}

    def init(path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "aieng.cli", "models", "init", str(path)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)

    done = init(repo / "adder" / "1")
    assert done.returncode == 0, done.stderr
    written = (repo / "adder" / "1" / "model.yaml").read_text()
    assert "batched: true" in written
    assert "# batching: every input and output has an open first axis" in written
    done = init(repo / "fixed" / "1" / "fixed.onnx")
    assert done.returncode == 0, done.stderr
    assert "model_file: \"fixed.onnx\"" in (repo / "fixed" / "1" / "model.yaml").read_text()
    again = init(repo / "adder" / "1")  # never overwritten
    assert again.returncode == 2 and "exists: not overwritten" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert (repo / "adder" / "1" / "model.yaml").read_text() == written

    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                      AIENG_POSTPROCESS_WORKERS="1").start()
    with srv.client() as c:
        models = c.models()["models"]
        assert "inferred" not in models["adder"]["versions"]["1"]  # served from the written model.yaml
        assert models["fixed"]["versions"]["1"]["max_batch_size"] == 0
        out = c.infer("adder", {"a": f32(4), "b": f32(4)})["outputs"]["sum"]
        np.testing.assert_array_equal(out, 2 * f32(4))
        out = c.infer("fixed", {"a": f32(1, 4), "b": f32(1, 4)})["outputs"]["sum"]
        np.testing.assert_array_equal(out, 2 * f32(1, 4))
    with th.InferenceServerClient(srv.oip_http) as h:
        assert h.get_model_config("fixed")["max_batch_size"] == 0
        assert h.get_model_metadata("fixed")["inputs"][0]["shape"] == [1, 4]
