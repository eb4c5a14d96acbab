"""The OIP front door driven by a client nobody here wrote: Triton's ``tritonclient`` (HTTP and gRPC).

Against the session server (one gateway on free ports): health, metadata and config as the clients
read them; infer for minilm (BYTES in, FP32 out; binary and JSON), orientation (an encoded image as
BYTES) and tabular (named inputs), several rows per request, the async APIs with many requests in
flight, the per-request timeout, statistics, the repository index, and errors with their status.  Every
result is compared with the native protocol's answer to the same input (float tolerance)."""
from __future__ import annotations

import json
import os
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.conftest import MODELS, save_tensor_model
from tests.e2e.texts import TEXTS, _documents

pytestmark = pytest.mark.e2e
ATOL = 1e-5


# the shared `server` fixture serves every demo model in the repository (each at version 1 by default)
DEMO_MODELS = sorted(p.name for p in Path(__file__).resolve().parents[2].joinpath("models").iterdir()
                     if (p / "1" / "model.yaml").is_file())


def native(server, model: str, inputs: dict) -> dict:
    with server.client() as c:
        return c.infer(model, inputs)["outputs"]


def text_input(mod, texts: list[str], binary: bool = True):
    t = mod.InferInput("text", [len(texts)], "BYTES")
    arr = np.array([s.encode() for s in texts], dtype=object)
    t.set_data_from_numpy(arr, binary_data=binary) if mod is th else t.set_data_from_numpy(arr)
    return t


def test_health_metadata_config_http(http):
    assert http.is_server_live() and http.is_server_ready()
    assert http.is_model_ready("minilm") and http.is_model_ready("minilm", "1")
    assert not http.is_model_ready("nope")
    meta = http.get_model_metadata("minilm")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    cfg = http.get_model_config("orientation")
    assert cfg["max_batch_size"] == 16 and "dynamic_batching" in cfg
    assert [i["name"] for i in cfg["input"]] == ["image"] and cfg["input"][0]["data_type"] == "TYPE_STRING"
    assert {o["name"]: o["dims"] for o in cfg["output"]} == {"label": [1], "scores": [4]}
    assert http.get_server_metadata()["name"] == "aieng"


def test_health_metadata_config_grpc(grpc_client):
    g = grpc_client
    assert g.is_server_live() and g.is_server_ready() and g.is_model_ready("tabular")
    meta = g.get_model_metadata("tabular", as_json=True)
    by_name = {i["name"]: i["datatype"] for i in meta["inputs"]}
    assert by_name == {"bill_length_mm": "FP32", "bill_depth_mm": "FP32", "flipper_length_mm": "FP32",
                       "body_mass_g": "FP32", "island": "BYTES", "sex": "BYTES"}
    cfg = g.get_model_config("minilm").config
    assert cfg.max_batch_size == 32 and cfg.dynamic_batching.max_queue_delay_microseconds == 5000
    assert [o.name for o in cfg.output] == ["embedding"] and list(cfg.output[0].dims) == [384]


@pytest.mark.parametrize("binary", [True, False])
def test_minilm_http_matches_native(server, http, binary):
    texts = TEXTS[:4]
    out = th.InferRequestedOutput("embedding", binary_data=binary)
    res = http.infer("minilm", [text_input(th, texts, binary)], outputs=[out])
    got = res.as_numpy("embedding")
    assert got.dtype == np.float32 and got.shape == (4, 384)
    for text, row in zip(texts, got):
        np.testing.assert_allclose(row, native(server, "minilm", {"text": text})["embedding"], atol=ATOL)


def test_minilm_grpc_matches_native(server, grpc_client):
    texts = TEXTS[2:]
    res = grpc_client.infer("minilm", [text_input(tg, texts)])
    got = res.as_numpy("embedding")
    assert got.shape == (len(texts), 384)
    for text, row in zip(texts, got):
        np.testing.assert_allclose(row, native(server, "minilm", {"text": text})["embedding"], atol=ATOL)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_orientation_image_as_bytes(server, http, grpc_client, transport):
    images = _documents()[:4]
    mod, client = (th, http) if transport == "http" else (tg, grpc_client)
    t = mod.InferInput("image", [len(images)], "BYTES")
    t.set_data_from_numpy(np.array(images, dtype=object))
    res = client.infer("orientation", [t])
    labels, scores = res.as_numpy("label"), res.as_numpy("scores")
    assert labels.shape == (4,) and scores.shape == (4, 4) and scores.dtype == np.float32
    for img, label, row in zip(images, labels, scores):
        want = native(server, "orientation", {"image": img})
        assert label.decode() == want["label"]
        np.testing.assert_allclose(row, want["scores"], atol=ATOL)


def _tabular_rows():
    with open(os.path.join(MODELS, "tabular", "1", "reference.json")) as fh:
        return [case["input"] for case in json.load(fh)["cases"]][:6]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_tabular_named_inputs(server, http, grpc_client, transport):
    rows = _tabular_rows()
    mod, client = (th, http) if transport == "http" else (tg, grpc_client)
    numbers = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
    inputs, sent = [], [dict() for _ in rows]
    for name in numbers:  # a missing number travels as NaN, which the gateway turns back into missing
        vals = np.array([np.nan if r.get(name) is None else r[name] for r in rows], dtype=np.float32)
        t = mod.InferInput(name, [len(rows)], "FP32")
        t.set_data_from_numpy(vals)
        inputs.append(t)
        for s, v in zip(sent, vals):
            s[name] = None if np.isnan(v) else float(v)
    for name in ("island", "sex"):
        vals = [r.get(name) or "" for r in rows]
        t = mod.InferInput(name, [len(rows)], "BYTES")
        t.set_data_from_numpy(np.array([v.encode() for v in vals], dtype=object))
        inputs.append(t)
        for s, v in zip(sent, vals):
            s[name] = v
    res = client.infer("tabular", inputs)
    labels, probs = res.as_numpy("label"), res.as_numpy("probabilities")
    assert probs.shape == (len(rows), 3)
    for s, label, p in zip(sent, labels, probs):
        want = native(server, "tabular", s)
        assert label.decode() == want["label"]
        np.testing.assert_allclose(p, want["probabilities"], atol=ATOL)


def test_http_async_many_in_flight(server, http):
    texts = [f"request number {i} about {TEXTS[i % len(TEXTS)][:30]}" for i in range(48)]
    pending = [(t, http.async_infer("minilm", [text_input(th, [t])])) for t in texts]
    want = {t: native(server, "minilm", {"text": t})["embedding"] for t in texts[:6]}
    results = {t: p.get_result(block=True, timeout=60).as_numpy("embedding")[0] for t, p in pending}
    assert len(results) == 48
    for t, emb in want.items():
        np.testing.assert_allclose(results[t], emb, atol=ATOL)
    assert len({r.tobytes() for r in results.values()}) == 48  # every answer is its own request's


def test_grpc_async_many_in_flight(server, grpc_client):
    texts = [f"grpc request {i}: {TEXTS[i % len(TEXTS)][:30]}" for i in range(48)]
    done: queue.Queue = queue.Queue()
    for t in texts:
        grpc_client.async_infer("minilm", [text_input(tg, [t])],
                                callback=lambda result, error, t=t: done.put((t, result, error)))
    got = {}
    for _ in texts:
        t, result, error = done.get(timeout=60)
        assert error is None, error
        got[t] = result.as_numpy("embedding")[0]
    assert set(got) == set(texts)
    for t in texts[:6]:
        np.testing.assert_allclose(got[t], native(server, "minilm", {"text": t})["embedding"], atol=ATOL)


def _status(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status()


def test_errors_http(http):
    assert _status(lambda: http.infer("nope", [text_input(th, ["x"])])) == "404"
    wrong_type = th.InferInput("text", [1], "FP32")
    wrong_type.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    assert _status(lambda: http.infer("minilm", [wrong_type])) == "400"
    wrong_shape = th.InferInput("text", [1, 2], "BYTES")
    wrong_shape.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
    assert _status(lambda: http.infer("minilm", [wrong_shape])) == "400"
    too_many = text_input(th, ["x"] * 33)  # minilm's max_batch_size is 32
    assert _status(lambda: http.infer("minilm", [too_many])) == "400"
    long_text = " ".join(["word"] * 120)
    assert _status(lambda: http.infer("minilm", [text_input(th, [long_text])], timeout=1000)) == "504"
    assert http.is_server_ready()


def test_errors_grpc(grpc_client):
    g = grpc_client
    assert _status(lambda: g.infer("nope", [text_input(tg, ["x"])])) == "StatusCode.NOT_FOUND"
    wrong_type = tg.InferInput("text", [1], "FP32")
    wrong_type.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    assert _status(lambda: g.infer("minilm", [wrong_type])) == "StatusCode.INVALID_ARGUMENT"
    wrong_shape = tg.InferInput("text", [1, 2], "BYTES")
    wrong_shape.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
    assert _status(lambda: g.infer("minilm", [wrong_shape])) == "StatusCode.INVALID_ARGUMENT"
    long_text = " ".join(["word"] * 120)
    assert _status(lambda: g.infer("minilm", [text_input(tg, [long_text])], timeout=1000)) \
        == "StatusCode.DEADLINE_EXCEEDED"
    assert _status(lambda: g.get_model_metadata("nope")) == "StatusCode.NOT_FOUND"


def test_statistics_every_field(http, grpc_client):
    http.infer("tabular", [_one_tabular()])
    stats = http.get_inference_statistics("tabular")["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("tabular", "1")]
    inf = stats[0]["inference_stats"]
    assert set(inf) == {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                        "cache_hit", "cache_miss"}
    assert inf["success"]["count"] >= 1 and inf["compute_infer"]["ns"] > 0
    assert {"inference_count", "execution_count", "last_inference", "batch_stats"} <= set(stats[0])
    every = grpc_client.get_inference_statistics(as_json=True)["model_stats"]
    assert sorted(s["name"] for s in every) == DEMO_MODELS


def _one_tabular():
    t = th.InferInput("bill_length_mm", [1], "FP32")
    t.set_data_from_numpy(np.array([40.0], dtype=np.float32))
    return t


def test_repository_index_and_refused_load(http, grpc_client):
    index = http.get_model_repository_index()
    assert sorted((m["name"], m["version"], m["state"]) for m in index) == [
        (name, "1", "READY") for name in DEMO_MODELS]
    names = [m.name for m in grpc_client.get_model_repository_index().models]
    assert names == DEMO_MODELS
    # AIENG_OIP_REPOSITORY_CONTROL is off by default: load/unload are admin ops, refused here
    v2 = json.dumps({"version_policy": {"specific": {"versions": [2]}}})
    assert _status(lambda: http.load_model("tabular", config=v2)) == "403"
    assert _status(lambda: http.unload_model("minilm")) == "403"
    assert _status(lambda: grpc_client.load_model("tabular", config=v2)) == "StatusCode.PERMISSION_DENIED"
    assert _status(lambda: grpc_client.unload_model("minilm")) == "StatusCode.PERMISSION_DENIED"
    after = http.get_model_repository_index()
    assert sorted((m["name"], m["version"]) for m in after) == [(name, "1") for name in DEMO_MODELS]


def test_logging_is_read_and_a_change_refused_by_default(server, http, grpc_client):
    """AIENG_OIP_LOGGING_CONTROL is off by default: the settings are read, a change is 403 /
    PERMISSION_DENIED and changes nothing (changing them: test_oip_logging.py)."""
    want = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
            "log_format": "json"}
    assert "logging" in http.get_server_metadata()["extensions"]
    assert "logging" in grpc_client.get_server_metadata().extensions
    assert http.get_log_settings() == want
    assert _status(lambda: http.update_log_settings({"log_verbose_level": 1})) == "403"
    assert _status(lambda: grpc_client.update_log_settings({"log_verbose_level": 1})) \
        == "StatusCode.PERMISSION_DENIED"
    assert http.get_log_settings() == want
    with server.client() as c:
        assert c.call({"op": "log_level", "id": 1})["level"] == "INFO"


def test_tensor_model_without_batching(make_server, tmp_path):
    """A tensor model that does not batch: shapes without the batch dimension, config max_batch_size 0,
    the request's tensor is the native request's tensor (a transpose checks the data's order)."""
    from tests.onnx_files import transpose_graph

    save_tensor_model(tmp_path / "repo", "transpose", transpose_graph())
    srv = make_server(AIENG_MODEL_REPOSITORY=str(tmp_path / "repo"), AIENG_PREPROCESS_WORKERS="1").start()
    with th.InferenceServerClient(srv.oip_http) as c:
        meta = c.get_model_metadata("transpose")
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 3]}]
        assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, 2]}]
        assert c.get_model_config("transpose")["max_batch_size"] == 0
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        t = th.InferInput("x", [2, 3], "FP32")
        t.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("transpose", [t]).as_numpy("y"), x.T)
    with tg.InferenceServerClient(srv.oip_grpc) as g:
        t = tg.InferInput("x", [2, 3], "FP32")
        t.set_data_from_numpy(x)
        np.testing.assert_array_equal(g.infer("transpose", [t]).as_numpy("y"), x.T)
