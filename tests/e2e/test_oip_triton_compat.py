"""What Triton's clients rely on (issue 35, items 3 and 4), against the real server with tritonclient:

- an unknown model or version answers in Triton's words, with 404 / NOT_FOUND;
- the CUDA shared-memory API on a server without a CUDA device: status lists nothing, unregister
  succeeds, register is refused (400 / INVALID_ARGUMENT) saying why;
- gzip and deflate request and response bodies as tritonclient sends and reads them, the binary tensor
  extension's header length counting uncompressed bytes; a zip bomb 413, a corrupt stream 400;
- ``serve --no-exit-on-error`` starts the others when one model fails to load: /readyz, the native
  ``models`` op, OIP model ready, metadata and the repository index say which failed and why.
"""
from __future__ import annotations

import gzip
import http.client
import json
import zlib

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess
from tests.e2e import triton_models

pytestmark = pytest.mark.e2e
BROKEN = "broken"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compat")
    repo = triton_models.build(tmp / "models", ["simple", "custom_identity_int32"])
    (repo / BROKEN / "1").mkdir(parents=True)
    (repo / BROKEN / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    (repo / BROKEN / "1" / "model.yaml").write_text(triton_models.model_yaml(
        triton_models.identity("int32"), "int32", [-1]))
    server = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                           AIENG_POSTPROCESS_WORKERS="1")
    server.args = ["--no-exit-on-error"]
    server.start()
    yield server
    assert server.stop() == 0, server.output()
    assert server.segments() == []


@pytest.fixture(scope="module")
def hc(srv):
    c = th.InferenceServerClient(srv.oip_http)
    yield c
    c.close()


@pytest.fixture(scope="module")
def gc(srv):
    c = tg.InferenceServerClient(srv.oip_grpc)
    yield c
    c.close()


def error_of(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


def simple_inputs(mod, binary: bool = True):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    for t, arr in zip(ins, (a, b)):
        t.set_data_from_numpy(arr, binary_data=binary) if mod is th else t.set_data_from_numpy(arr)
    return ins, a, b


# -- unknown models -------------------------------------------------------------------------------

def test_unknown_model_in_tritons_words_http(hc):
    err = error_of(lambda: hc.get_model_metadata("nope"))
    assert err.status() == "404" and err.message() == "Request for unknown model: 'nope' is not found"
    err = error_of(lambda: hc.infer("nope", simple_inputs(th)[0]))
    assert err.status() == "404" and err.message().startswith("Request for unknown model: 'nope'")
    err = error_of(lambda: hc.get_model_config("simple", "7"))
    assert err.status() == "404"
    assert err.message() == "Request for unknown model: 'simple' version 7 is not found"


def test_unknown_model_in_tritons_words_grpc(gc):
    err = error_of(lambda: gc.get_model_metadata("nope"))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'nope' is not found"
    err = error_of(lambda: gc.infer("nope", simple_inputs(tg)[0]))
    assert err.status() == "StatusCode.NOT_FOUND" and err.message().startswith("Request for unknown model")


# -- CUDA shared memory on a CPU server -----------------------------------------------------------

def test_cuda_shared_memory_http(hc, srv):
    hc.unregister_cuda_shared_memory()  # all: nothing to do
    hc.unregister_cuda_shared_memory("never-registered")
    assert hc.get_cuda_shared_memory_status() == []
    err = error_of(lambda: hc.get_cuda_shared_memory_status("x"))
    assert err.status() == "404" and "'x'" in err.message()
    err = error_of(lambda: hc.register_cuda_shared_memory("r", b"\0" * 64, 0, 64))
    assert err.status() == "400" and "no CUDA device" in err.message(), err.message()
    conn = http.client.HTTPConnection(srv.oip_http, timeout=10)
    conn.request("GET", "/v2/cudasharedmemory/unregister")
    assert conn.getresponse().status == 405


def test_cuda_shared_memory_grpc(gc):
    gc.unregister_cuda_shared_memory()
    gc.unregister_cuda_shared_memory("never-registered")
    assert len(gc.get_cuda_shared_memory_status().regions) == 0
    err = error_of(lambda: gc.register_cuda_shared_memory("r", b"\0" * 64, 0, 64))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "no CUDA device" in err.message()


# -- compression --------------------------------------------------------------------------------

@pytest.mark.parametrize("request_alg,response_alg", [("gzip", None), ("deflate", None), (None, "gzip"),
                                                       (None, "deflate"), ("gzip", "deflate")])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_compression(hc, request_alg, response_alg, binary):
    ins, a, b = simple_inputs(th, binary)
    outs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    res = hc.infer("simple", ins, outputs=outs, request_compression_algorithm=request_alg,
                   response_compression_algorithm=response_alg)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def post(srv, path: str, body: bytes, headers: dict) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(srv.oip_http, timeout=30)
    conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    conn.close()
    return out


def binary_request() -> tuple[bytes, int]:
    head = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16],
                                   "parameters": {"binary_data_size": 64}} for n in ("INPUT0", "INPUT1")],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    return head + np.arange(16, dtype=np.int32).tobytes() + np.ones(16, np.int32).tobytes(), len(head)


def test_binary_header_length_counts_uncompressed_bytes_both_ways(srv):
    body, hlen = binary_request()
    status, headers, out = post(srv, "/v2/models/simple/infer", gzip.compress(body),
                                {"Content-Encoding": "gzip", "Accept-Encoding": "deflate",
                                 "Inference-Header-Content-Length": str(hlen)})
    assert status == 200 and headers["content-encoding"] == "deflate", out[:200]
    plain = zlib.decompress(out)
    n = int(headers["inference-header-content-length"])
    assert json.loads(plain[:n])["outputs"][0]["parameters"] == {"binary_data_size": 64}
    np.testing.assert_array_equal(np.frombuffer(plain[n:], np.int32), np.arange(16) + 1)


def test_only_infer_answers_are_compressed(srv):
    """aiohttp (tritonclient's aio client) asks for gzip on every call and reads only infer answers
    compressed, as Triton sends them."""
    conn = http.client.HTTPConnection(srv.oip_http, timeout=10)
    conn.request("GET", "/v2/models/simple", headers={"Accept-Encoding": "gzip"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Encoding") is None
    assert json.loads(r.read())["name"] == "simple"


def test_a_zip_bomb_and_a_corrupt_stream_are_refused(srv):
    bomb = gzip.compress(b" " * (256 << 20))  # 256 MiB of spaces in ~250 KiB: past the body limit
    status, _, out = post(srv, "/v2/models/simple/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and b"limit" in out, out
    status, _, out = post(srv, "/v2/models/simple/infer", b"\x1f\x8b garbage", {"Content-Encoding": "gzip"})
    assert status == 400 and b"gzip" in out, out
    status, _, out = post(srv, "/v2/models/simple/infer", b"{}", {"Content-Encoding": "br"})
    assert status == 415, out
    ins, a, b = simple_inputs(th)
    res = th.InferenceServerClient(srv.oip_http).infer("simple", ins)  # still serving, and right
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)


# -- one model's failure is its own ---------------------------------------------------------------

def test_a_failed_model_is_its_own(srv, hc, gc):
    assert hc.is_server_ready() and hc.is_model_ready("simple")
    assert not hc.is_model_ready(BROKEN) and not gc.is_model_ready(BROKEN)
    conn = http.client.HTTPConnection(srv.oip_http, timeout=10)
    conn.request("GET", f"/v2/models/{BROKEN}/ready")
    r = conn.getresponse()
    why = json.loads(r.read())["error"]
    assert r.status == 503 and f"model {BROKEN}:1" in why and "model.onnx" in why, why
    for call in (lambda: hc.get_model_metadata(BROKEN), lambda: hc.get_model_config(BROKEN)):
        err = error_of(call)
        assert err.status() == "503", err
        assert err.message().startswith(f"Request for unknown model: '{BROKEN}' has no available versions: "
                                        f"model {BROKEN}:1 (")
    err = error_of(lambda: gc.get_model_metadata(BROKEN, "1"))
    assert err.status() == "StatusCode.UNAVAILABLE" and "version 1 is not at ready state" in err.message()
    index = {e["name"]: e for e in hc.get_model_repository_index()}
    assert index["simple"]["state"] == "READY"
    assert index[BROKEN]["state"] == "UNAVAILABLE" and f"model {BROKEN}:1" in index[BROKEN]["reason"]
    health = srv.health()
    assert health["ready"] and f"{BROKEN}:1" in health["failed_models"], health
    with srv.client(timeout_s=10) as c:
        models = c.models()["models"]
        assert models[BROKEN]["versions"]["1"]["load_error"].startswith(f"model {BROKEN}:1 (")
        assert models["simple"]["versions"]["1"]["load_error"] is None
        r = c.infer(BROKEN, {"INPUT0": np.arange(3, dtype=np.int32)}, raise_on_error=False)
        assert r["error"]["code"] == "UNAVAILABLE" and f"model {BROKEN}:1" in r["error"]["message"]


def test_exit_on_error_is_the_default_and_the_flag_wins_over_the_variable(make_server, tmp_path):
    """Fail-fast stays the default (Triton's --exit-on-error); the flag overrides AIENG_STRICT_MODEL_LOAD."""
    repo = triton_models.build(tmp_path / "models", ["simple"])
    (repo / BROKEN / "1").mkdir(parents=True)
    (repo / BROKEN / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    (repo / BROKEN / "1" / "model.yaml").write_text(triton_models.model_yaml(
        triton_models.identity("int32"), "int32", [-1]))
    for env, args in (({}, []), ({"AIENG_STRICT_MODEL_LOAD": "false"}, ["--exit-on-error"])):
        s = make_server(AIENG_MODEL_REPOSITORY=str(repo), **env)
        s.args = args
        s.start(wait=False)
        code = s.proc.wait(120)
        assert code != 0 and f"model {BROKEN}:1" in s.output(), s.output()[-2000:]


def test_a_grpc_zip_bomb_is_refused_by_its_inflated_size(gc, hc):
    """gRPC compression is grpcio's: the message limit applies to the inflated message."""
    big = np.zeros((1, 10 << 20), dtype=np.int32)  # 40 MiB of zeros, ~40 KiB gzipped: past the 32 MiB limit
    t = tg.InferInput("INPUT0", list(big.shape), "INT32")
    t.set_data_from_numpy(big)
    err = error_of(lambda: gc.infer("simple", [t], compression_algorithm="gzip"))
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED", err
    assert hc.is_model_ready("simple")  # still serving
