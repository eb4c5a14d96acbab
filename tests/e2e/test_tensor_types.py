"""Every tensor type ONNX Runtime runs, both ways, over the native protocol and both OIP transports.

One server over a tmp repository of small graphs built here with ``onnx.helper``, each a hand-written
tensor ``model.yaml`` (batched, ``max_batch_size`` 8):
- ``alltypes``: one input and one output per dtype (bool, uint8-64, int8-64, float16/32/64, string);
  each numeric output is ``x + x`` (bool: ``Not``), the string one ``Identity``;
- ``simple_string``: Triton's QA model as a graph: INPUT0, INPUT1 strings of numbers [16] -> OUTPUT0 their
  sum, OUTPUT1 their difference, as strings (Cast string->int32, Add, Sub, Cast int32->string);
- ``simple_identity``: a string Identity with a variable second axis (rows of different lengths batch
  together, padded with the empty string and cut back);
- ``identity_unbatched``: a string Identity that does not batch (``max_batch_size`` 1: OIP whole shapes);
- ``bf16``: a bfloat16 Identity, which fails its own load naming the type (start not strict) while the
  others serve.
Values are checked exactly; wrong datatypes get one INVALID_INPUT / 400 naming the input and both types.
"""
from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest

from aieng.client.single import ServerError
from tests.onnx_files import save_onnx

pytestmark = pytest.mark.e2e

NUMERIC = {  # ONNX element type name -> (numpy dtype, OIP datatype)
    "BOOL": (np.bool_, "BOOL"), "UINT8": (np.uint8, "UINT8"), "UINT16": (np.uint16, "UINT16"),
    "UINT32": (np.uint32, "UINT32"), "UINT64": (np.uint64, "UINT64"), "INT8": (np.int8, "INT8"),
    "INT16": (np.int16, "INT16"), "INT32": (np.int32, "INT32"), "INT64": (np.int64, "INT64"),
    "FLOAT16": (np.float16, "FP16"), "FLOAT": (np.float32, "FP32"), "DOUBLE": (np.float64, "FP64"),
}
YAML = ("inputs: [{ins}]\noutputs: [{outs}]\npreprocess: {{type: tensor}}\npostprocess: {{type: tensor}}\n"
        "batching: {{max_batch_size: {mbs}, max_wait_ms: 2}}\n")


def _save(repo, name, graph, ins, outs, max_batch_size: int = 8):
    d = repo / name / "1"
    save_onnx(d / "model.onnx", graph)
    (d / "model.yaml").write_text(YAML.format(
        ins=", ".join(f"{{name: {n}, kind: tensor}}" for n in ins),
        outs=", ".join(f"{{name: {n}, kind: tensor, dtype: {dt}, shape: {shape}}}" for n, dt, shape in outs),
        mbs=max_batch_size))


def build_repo(repo) -> None:
    from onnx import TensorProto as T
    from onnx import helper

    vi = helper.make_tensor_value_info
    nodes, ins, outs, decl = [], [], [], []
    for et in list(NUMERIC) + ["STRING"]:
        x, y = f"in_{et.lower()}", f"out_{et.lower()}"
        op = {"BOOL": "Not", "STRING": "Identity"}.get(et, "Add")
        nodes.append(helper.make_node(op, [x, x] if op == "Add" else [x], [y]))
        ins.append(vi(x, getattr(T, et), ["batch", 3]))
        outs.append(vi(y, getattr(T, et), ["batch", 3]))
        decl.append((y, "bytes" if et == "STRING" else np.dtype(NUMERIC[et][0]).name, "[3]"))
    _save(repo, "alltypes", helper.make_graph(nodes, "alltypes", ins, outs), [i.name for i in ins], decl)

    cast = [helper.make_node("Cast", ["INPUT0"], ["a"], to=T.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=T.INT32),
            helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Sub", ["a", "b"], ["d"]),
            helper.make_node("Cast", ["s"], ["OUTPUT0"], to=T.STRING),
            helper.make_node("Cast", ["d"], ["OUTPUT1"], to=T.STRING)]
    _save(repo, "simple_string", helper.make_graph(
        cast, "simple_string", [vi("INPUT0", T.STRING, ["batch", 16]), vi("INPUT1", T.STRING, ["batch", 16])],
        [vi("OUTPUT0", T.STRING, ["batch", 16]), vi("OUTPUT1", T.STRING, ["batch", 16])]),
        ["INPUT0", "INPUT1"], [("OUTPUT0", "bytes", "[16]"), ("OUTPUT1", "bytes", "[16]")])

    _save(repo, "simple_identity", helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "simple_identity",
        [vi("INPUT0", T.STRING, ["batch", "n"])], [vi("OUTPUT0", T.STRING, ["batch", "n"])]),
        ["INPUT0"], [("OUTPUT0", "bytes", "[-1]")])

    # max_batch_size 1: OIP shows Triton's max_batch_size 0, a request is one native request's whole tensor
    _save(repo, "identity_unbatched", helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity_unbatched",
        [vi("INPUT0", T.STRING, ["batch", "n"])], [vi("OUTPUT0", T.STRING, ["batch", "n"])]),
        ["INPUT0"], [("OUTPUT0", "bytes", "[-1]")], max_batch_size=1)

    _save(repo, "bf16", helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "bf16",
        [vi("x", T.BFLOAT16, ["batch", 2])], [vi("y", T.BFLOAT16, ["batch", 2])]),
        ["x"], [("y", "float32", "[2]")])


@pytest.fixture(scope="module", params=["post-in-executor", "post-in-pool"])
def server(tmp_path_factory, request):
    """Outputs answered from the executor (these chains are cheap) and, with AIENG_INLINE_POSTPROCESS_US 0,
    through the executor's output ring to a postprocess worker (string outputs packed in a slot)."""
    from tests.conftest import ServerProcess

    tmp = tmp_path_factory.mktemp("tensor_types")
    build_repo(tmp / "repo")
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(tmp / "repo"), AIENG_STRICT_MODEL_LOAD="false",
                        AIENG_PREPROCESS_WORKERS="1", AIENG_POSTPROCESS_WORKERS="1",
                        AIENG_INLINE_POSTPROCESS_US="0" if request.param == "post-in-pool" else "200").start()
    where = "pool" if request.param == "post-in-pool" else "executor"
    with srv.client() as c:  # the route under test is the one taken
        versions = c.models()["models"]["simple_string"]["versions"]
    assert versions["1"]["onnx"]["postprocess"]["where"] == where
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def sample(et: str, rows: int) -> np.ndarray:
    """``rows`` x 3 values of the type, its edges included (wrap-around of x + x is numpy's too)."""
    if et == "STRING":
        pool = [b"", b"a", "\u00e9t\u00e9".encode(), b"x" * 50, b"0", b"with space"]
        arr = np.empty(rows * 3, dtype=object)
        arr[:] = [pool[i % len(pool)] for i in range(rows * 3)]
        return arr.reshape(rows, 3)
    dt = np.dtype(NUMERIC[et][0])
    if dt.kind == "b":
        return (np.arange(rows * 3) % 2 == 0).reshape(rows, 3)
    if dt.kind == "f":
        return (np.arange(rows * 3, dtype=dt) - 1.5).reshape(rows, 3)
    info = np.iinfo(dt)
    vals = [info.min, info.max, 0, 1, info.max // 3, info.min // 2 if info.min else 7]
    return np.array([vals[i % len(vals)] for i in range(rows * 3)], dtype=dt).reshape(rows, 3)


def expected(et: str, x: np.ndarray) -> np.ndarray:
    if et == "STRING":
        return x
    if et == "BOOL":
        return ~x
    with np.errstate(over="ignore"):
        return x + x


TYPES = list(NUMERIC) + ["STRING"]


def test_native_every_type_both_ways(server):
    with server.client() as c:
        for row in range(2):
            inputs = {f"in_{et.lower()}": sample(et, 2)[row] for et in TYPES}
            out = c.infer("alltypes", inputs)["outputs"]
            for et in TYPES:
                got, want = out[f"out_{et.lower()}"], expected(et, inputs[f"in_{et.lower()}"])
                assert got.dtype == want.dtype, et
                assert got.tolist() == want.tolist(), et
        # str elements are their UTF-8 bytes; answers are always bytes
        inputs = {f"in_{et.lower()}": sample(et, 1)[0] for et in TYPES}
        inputs["in_string"] = np.array(["a", "\u00e9", ""])
        assert c.infer("alltypes", inputs)["outputs"]["out_string"].tolist() == [b"a", "\u00e9".encode(), b""]


def _triton_inputs(mod, binary: bool, rows: int = 2):
    inputs = []
    for et in TYPES:
        t = mod.InferInput(f"in_{et.lower()}", [rows, 3], "BYTES" if et == "STRING" else NUMERIC[et][1])
        if binary is None:
            t.set_data_from_numpy(sample(et, rows))
        else:
            t.set_data_from_numpy(sample(et, rows), binary_data=binary)
        inputs.append(t)
    return inputs


def _check_triton(result, rows: int = 2):
    for et in TYPES:
        got, want = result.as_numpy(f"out_{et.lower()}"), expected(et, sample(et, rows))
        if et == "STRING":  # tritonclient's BYTES: an object array (bytes, or str from JSON)
            got = np.vectorize(lambda v: v if isinstance(v, bytes) else v.encode(), otypes=[object])(got)
        assert got.dtype == want.dtype, et
        assert got.shape == want.shape and got.tolist() == want.tolist(), et


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_oip_http_every_type_both_ways(server, binary):
    import tritonclient.http as th

    with th.InferenceServerClient(server.oip_http) as c:
        meta = c.get_model_metadata("alltypes")
        types = {i["name"]: i["datatype"] for i in meta["inputs"] + meta["outputs"]}
        for et in TYPES:
            want = "BYTES" if et == "STRING" else NUMERIC[et][1]
            assert types[f"in_{et.lower()}"] == types[f"out_{et.lower()}"] == want
        outs = [th.InferRequestedOutput(f"out_{et.lower()}", binary_data=binary) for et in TYPES]
        _check_triton(c.infer("alltypes", _triton_inputs(th, binary), outputs=outs))


def test_oip_grpc_every_type_both_ways(server):
    import tritonclient.grpc as tg

    with tg.InferenceServerClient(server.oip_grpc) as c:
        meta = c.get_model_metadata("alltypes", as_json=True)
        assert {i["name"]: i["datatype"] for i in meta["inputs"]}["in_string"] == "BYTES"
        _check_triton(c.infer("alltypes", _triton_inputs(tg, None), outputs=[
            tg.InferRequestedOutput(f"out_{et.lower()}") for et in TYPES]))


def _string_pair():
    a = np.arange(16, dtype=np.int32).reshape(1, 16) * 7 - 20
    b = np.full((1, 16), -3, dtype=np.int32)
    as_bytes = np.vectorize(lambda v: str(v).encode(), otypes=[object])
    return a, b, as_bytes(a), as_bytes(b)


@pytest.mark.parametrize("transport", ["native", "http-json", "http-binary", "grpc", "grpc-contents"])
def test_simple_string_sums_numbers_sent_as_strings(server, transport):
    a, b, sa, sb = _string_pair()
    if transport == "native":
        with server.client() as c:
            out = c.infer("simple_string", {"INPUT0": sa[0], "INPUT1": sb[0]})["outputs"]
        o0, o1 = out["OUTPUT0"][None], out["OUTPUT1"][None]
    elif transport.startswith("http"):
        import tritonclient.http as th

        binary = transport == "http-binary"
        ins = [th.InferInput("INPUT0", [1, 16], "BYTES"), th.InferInput("INPUT1", [1, 16], "BYTES")]
        ins[0].set_data_from_numpy(sa, binary_data=binary)
        ins[1].set_data_from_numpy(sb, binary_data=binary)
        outs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
        with th.InferenceServerClient(server.oip_http) as c:
            r = c.infer("simple_string", ins, outputs=outs)
        o0, o1 = r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")
    else:
        import tritonclient.grpc as tg
        from tritonclient.grpc import service_pb2 as pb

        with tg.InferenceServerClient(server.oip_grpc) as c:
            if transport == "grpc":
                ins = [tg.InferInput("INPUT0", [1, 16], "BYTES"), tg.InferInput("INPUT1", [1, 16], "BYTES")]
                ins[0].set_data_from_numpy(sa)
                ins[1].set_data_from_numpy(sb)
                r = c.infer("simple_string", ins)
                o0, o1 = r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")
            else:  # explicit bytes_contents, as Triton's grpc_explicit_byte_content_client does
                req = pb.ModelInferRequest(model_name="simple_string")
                for name, arr in (("INPUT0", sa), ("INPUT1", sb)):
                    t = req.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
                    t.contents.bytes_contents.extend(arr.reshape(-1).tolist())
                resp = c._client_stub.ModelInfer(req)
                raw = {o.name: resp.raw_output_contents[i] for i, o in enumerate(resp.outputs)}
                from aieng.gateway.codec import unpack_bytes

                o0 = np.array(unpack_bytes(raw["OUTPUT0"], 16, "o"), dtype=object).reshape(1, 16)
                o1 = np.array(unpack_bytes(raw["OUTPUT1"], 16, "o"), dtype=object).reshape(1, 16)
                assert [o.datatype for o in resp.outputs] == ["BYTES", "BYTES"]
    to_int = np.vectorize(lambda v: int(v), otypes=[np.int64])
    assert to_int(o0).tolist() == (a + b).tolist()
    assert to_int(o1).tolist() == (a - b).tolist()


def test_string_rows_of_different_lengths_batch_and_come_back_whole(server):
    """Concurrent requests of 1..6 strings each: whatever batches they share (padded with the empty string
    along the variable axis), every one gets exactly its own elements back."""
    results: dict[int, object] = {}

    def one(i: int) -> None:
        x = np.array([f"r{i}-{k}".encode() for k in range(1 + i % 6)], dtype=object)
        with server.client() as c:
            results[i] = (x, c.infer("simple_identity", {"INPUT0": x}))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 24
    for x, reply in results.values():
        assert reply["outputs"]["OUTPUT0"].tolist() == x.tolist()


def test_an_unbatched_string_model_takes_whole_shapes(server):
    import tritonclient.grpc as tg
    import tritonclient.http as th

    x = np.array([b"one", b"", "tr\u00e8s".encode()], dtype=object)
    with th.InferenceServerClient(server.oip_http) as c:
        meta = c.get_model_metadata("identity_unbatched")
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}]
        assert c.get_model_config("identity_unbatched")["max_batch_size"] == 0
        for binary in (False, True):
            t = th.InferInput("INPUT0", [3], "BYTES")
            t.set_data_from_numpy(x, binary_data=binary)
            got = c.infer("identity_unbatched", [t], outputs=[th.InferRequestedOutput("OUTPUT0", binary)])
            got = [v if isinstance(v, bytes) else v.encode() for v in got.as_numpy("OUTPUT0")]
            assert got == x.tolist()
    with tg.InferenceServerClient(server.oip_grpc) as c:
        t = tg.InferInput("INPUT0", [3], "BYTES")
        t.set_data_from_numpy(x)
        assert c.infer("identity_unbatched", [t]).as_numpy("OUTPUT0").tolist() == x.tolist()


def test_wrong_datatypes_are_one_clear_error_each(server):
    import tritonclient.grpc as tg
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    inputs = {f"in_{et.lower()}": sample(et, 1)[0] for et in TYPES}
    with server.client() as c:
        for name, bad, want in (("in_int32", np.zeros(3, np.float32), "must be int32, got float32"),
                                ("in_int32", np.array([b"1", b"2", b"3"], dtype=object),
                                 "must be int32, got bytes"),
                                ("in_string", np.zeros(3, np.int64), "must be bytes, got int64")):
            with pytest.raises(ServerError) as info:
                c.infer("alltypes", {**inputs, name: bad})
            assert info.value.code == "INVALID_INPUT"
            assert f"input '{name}' {want}" in info.value.message
        with pytest.raises(ServerError) as info:  # ONNX Runtime's strings are text
            c.infer("simple_identity", {"INPUT0": np.array([b"ok", b"\xff\xfe"], dtype=object)})
        assert info.value.code == "INVALID_INPUT" and "element 1 is not valid UTF-8" in info.value.message

    x = th.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.zeros((1, 16), np.float32))
    y = th.InferInput("INPUT1", [1, 16], "BYTES")
    y.set_data_from_numpy(_string_pair()[3])
    with th.InferenceServerClient(server.oip_http) as c:
        with pytest.raises(InferenceServerException) as info:
            c.infer("simple_string", [x, y])
        assert info.value.status() == "400"
        assert "input 'INPUT0' must be bytes, got float32" in info.value.message()
    gx = tg.InferInput("INPUT0", [1, 16], "INT32")
    gx.set_data_from_numpy(np.zeros((1, 16), np.int32))
    gy = tg.InferInput("INPUT1", [1, 16], "BYTES")
    gy.set_data_from_numpy(_string_pair()[3])
    with tg.InferenceServerClient(server.oip_grpc) as c:
        with pytest.raises(InferenceServerException) as info:
            c.infer("simple_string", [gx, gy])
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "input 'INPUT0' must be bytes, got int32" in info.value.message()
    # and nothing else was affected
    a, b, sa, sb = _string_pair()
    with server.client() as c:
        out = c.infer("simple_string", {"INPUT0": sa[0], "INPUT1": sb[0]})["outputs"]
    assert [int(v) for v in out["OUTPUT0"]] == (a + b)[0].tolist()


def test_a_bfloat16_graph_fails_only_its_own_load_naming_the_type(server):
    with server.client() as c:
        models = c.models()["models"]
        with pytest.raises(ServerError) as info:
            c.infer("bf16", {"x": np.zeros(2, np.float32)})
    assert info.value.code == "UNAVAILABLE"
    assert "input x has unsupported type tensor(bfloat16)" in info.value.message
    assert {"alltypes", "simple_string", "simple_identity", "identity_unbatched"} <= set(models)


def test_a_strict_start_with_a_bfloat16_graph_fails_naming_it(make_server, tmp_path):
    """The default start (strict) refuses the repository, and says which model and type."""
    build_repo(tmp_path / "repo")
    for name in ("alltypes", "simple_string", "simple_identity", "identity_unbatched"):
        shutil.rmtree(tmp_path / "repo" / name)
    srv = make_server(AIENG_MODEL_REPOSITORY=str(tmp_path / "repo"))
    with pytest.raises(RuntimeError) as info:
        srv.start(timeout=60)
    assert "bf16" in str(info.value) and "input x has unsupported type tensor(bfloat16)" in str(info.value)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_simple_string_through_system_shared_memory(server, transport):
    """Triton's simple_*_shm_string_client: BYTES inputs read from a region, outputs written into one."""
    import os

    import tritonclient.grpc as tg
    import tritonclient.http as th
    from tritonclient.utils import serialize_byte_tensor

    from tests.tritonshm import shm

    mod = th if transport == "http" else tg
    a, b, sa, sb = _string_pair()
    ser0, ser1 = serialize_byte_tensor(sa), serialize_byte_tensor(sb)
    n0, n1 = len(ser0.item()), len(ser1.item())
    tag_in, tag_out = f"str-in-{transport}", f"str-out-{transport}"
    key_in, key_out = f"/aieng-tt-{os.getpid()}-{tag_in}", f"/aieng-tt-{os.getpid()}-{tag_out}"
    h_in = shm.create_shared_memory_region(tag_in, key_in, n0 + n1)
    h_out = shm.create_shared_memory_region(tag_out, key_out, 1024)
    client = (th.InferenceServerClient(server.oip_http) if transport == "http"
              else tg.InferenceServerClient(server.oip_grpc))
    try:
        shm.set_shared_memory_region(h_in, [ser0, ser1])
        client.register_system_shared_memory(tag_in, key_in, n0 + n1)
        client.register_system_shared_memory(tag_out, key_out, 1024)
        ins = [mod.InferInput("INPUT0", [1, 16], "BYTES"), mod.InferInput("INPUT1", [1, 16], "BYTES")]
        ins[0].set_shared_memory(tag_in, n0)
        ins[1].set_shared_memory(tag_in, n1, offset=n0)
        outs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        outs[0].set_shared_memory(tag_out, 512)
        outs[1].set_shared_memory(tag_out, 512, offset=512)
        client.infer("simple_string", ins, outputs=outs)
        o0 = shm.get_contents_as_numpy(h_out, np.object_, [1, 16])
        o1 = shm.get_contents_as_numpy(h_out, np.object_, [1, 16], offset=512)
        assert [int(v) for v in o0.reshape(-1)] == (a + b).reshape(-1).tolist()
        assert [int(v) for v in o1.reshape(-1)] == (a - b).reshape(-1).tolist()
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
