"""The OIP repository extension's load and unload against the real server, driven by ``tritonclient``.

With ``AIENG_OIP_REPOSITORY_CONTROL=1`` the gateway forwards load/unload to the admin socket and waits
for the outcome.  The version is named the way tritonclient can send it: ``config`` holding a model
config whose ``version_policy.specific.versions`` lists it (HTTP and gRPC), or ``?version=N`` (HTTP).
The demo repository's tabular version 2 is not served at start (its model.yaml policy is ``["1"]``) and
its golden set passes; the broken version is a copy of it with its labels permuted, which its golden
set must refuse.  With the setting off (the default) load/unload are refused: test_oip_client.py.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.conftest import MODELS, free_port
from tests.e2e.rollout_helpers import start

pytestmark = pytest.mark.e2e
V2 = json.dumps({"version_policy": {"specific": {"versions": [2]}}})
ATOL = 1e-5
ROW = {"island": "Biscoe", "bill_length_mm": 45.1, "bill_depth_mm": 15.0, "flipper_length_mm": 210.0,
       "body_mass_g": 4000.0, "sex": "female"}  # every feature given: the same input on both protocols


def clients(srv):
    return th.InferenceServerClient(srv.oip_http), tg.InferenceServerClient(srv.oip_grpc)


def index(http) -> dict:
    return {(m["name"], m["version"]): (m["state"], m.get("reason", "")) for m in
            http.get_model_repository_index()}


def penguin(mod):
    """ROW as named OIP inputs."""
    row, inputs = ROW, []
    for name in ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"):
        t = mod.InferInput(name, [1], "FP32")
        t.set_data_from_numpy(np.array([row[name]], dtype=np.float32))
        inputs.append(t)
    for name in ("island", "sex"):
        t = mod.InferInput(name, [1], "BYTES")
        t.set_data_from_numpy(np.array([row[name].encode()], dtype=object))
        inputs.append(t)
    return inputs


def native_v2(srv) -> dict:
    with srv.client(timeout_s=30) as c:
        return c.infer("tabular", ROW, version="2")["outputs"]


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_load_infer_unload_over_http(make_server, tmp_path):
    srv = start(make_server, tmp_path, MODELS, AIENG_MODELS="tabular", AIENG_OIP_REPOSITORY_CONTROL="1")
    http = th.InferenceServerClient(srv.oip_http)
    try:
        assert index(http) == {("tabular", "1"): ("READY", "")}
        http.load_model("tabular")  # no version: what the policy serves (1) is loaded already
        assert index(http) == {("tabular", "1"): ("READY", "")}

        http.load_model("tabular", config=V2)  # returns once the golden set has passed
        assert index(http)[("tabular", "2")] == ("READY", "")
        assert http.is_model_ready("tabular", "2")
        res = http.infer("tabular", penguin(th), model_version="2")
        assert res.get_response()["model_version"] == "2"
        want = native_v2(srv)
        assert res.as_numpy("label")[0].decode() == want["label"]
        np.testing.assert_allclose(res.as_numpy("probabilities")[0], want["probabilities"], atol=ATOL)

        http.unload_model("tabular", query_params={"version": "2"})  # weight 0 after a load: allowed
        assert index(http)[("tabular", "2")] == ("UNAVAILABLE", "unloaded")
        assert _error(lambda: http.infer("tabular", penguin(th), model_version="2")).status() == "404"
        assert http.infer("tabular", penguin(th)).get_response()["model_version"] == "1"
    finally:
        http.close()


def test_load_infer_unload_over_grpc(make_server, tmp_path):
    srv = start(make_server, tmp_path, MODELS, AIENG_MODELS="tabular", AIENG_OIP_REPOSITORY_CONTROL="1")
    grpc = tg.InferenceServerClient(srv.oip_grpc)
    try:
        grpc.load_model("tabular", config=V2)
        states = {(m.name, m.version): m.state for m in grpc.get_model_repository_index().models}
        assert states == {("tabular", "1"): "READY", ("tabular", "2"): "READY"}
        res = grpc.infer("tabular", penguin(tg), model_version="2")
        assert res.get_response().model_version == "2"
        assert res.as_numpy("label")[0].decode() == native_v2(srv)["label"]
        grpc.unload_model("tabular")  # no version: every loaded version with weight 0, here 2
        states = {(m.name, m.version): m.state for m in grpc.get_model_repository_index().models}
        assert states == {("tabular", "1"): "READY", ("tabular", "2"): "UNAVAILABLE"}
        err = _error(lambda: grpc.unload_model("tabular"))  # only version 1 is left, with weight 100
        assert err.status() == "StatusCode.INVALID_ARGUMENT" and "serves traffic" in err.message()
        assert _error(lambda: grpc.infer("tabular", penguin(tg), model_version="2")).status() \
            == "StatusCode.NOT_FOUND"
    finally:
        grpc.close()


def test_a_version_failing_its_golden_set_is_refused_and_stays_unavailable(make_server, tmp_path):
    repo = tmp_path / "repo"
    for v in ("1", "2"):
        shutil.copytree(os.path.join(MODELS, "tabular", v), repo / "tabular" / v)
    (repo / "tabular" / "model.yaml").write_text('versions: ["1"]\nrouting: {weights: {"1": 100}}\n')
    labels_file = repo / "tabular" / "2" / "labels.json"
    labels = json.loads(labels_file.read_text())
    assert isinstance(labels, list) and len(labels) == 3
    labels_file.write_text(json.dumps(labels[1:] + labels[:1]))  # the broken version: labels permuted
    srv = start(make_server, tmp_path, repo, AIENG_OIP_REPOSITORY_CONTROL="1")
    http, grpc = clients(srv)
    try:
        err = _error(lambda: http.load_model("tabular", config=V2))
        assert err.status() == "400" and "golden case" in err.message(), err
        state, reason = index(http)[("tabular", "2")]
        assert state == "UNAVAILABLE" and "golden case" in reason
        assert not http.is_model_ready("tabular", "2")
        states = {(m.name, m.version): m.state for m in grpc.get_model_repository_index().models}
        assert states == {("tabular", "1"): "READY", ("tabular", "2"): "UNAVAILABLE"}
        assert _error(lambda: http.infer("tabular", penguin(th), model_version="2")).status() == "404"
        assert http.infer("tabular", penguin(th)).get_response()["model_version"] == "1"
    finally:
        http.close()
        grpc.close()


def test_load_through_an_admin_socket_with_curve(make_server, tmp_path):
    """Admin CURVE without a keys dir (any key admitted): the gateway connects with a key of its own."""
    import zmq.auth

    (tmp_path / "server").mkdir()
    _, server_secret = zmq.auth.create_certificates(str(tmp_path / "server"), "server")
    admin = f"tcp://127.0.0.1:{free_port()}"
    srv = make_server(AIENG_MODELS="tabular", AIENG_STATE_DIR=str(tmp_path / "state"),
                      AIENG_ADMIN_ADDR=admin, AIENG_ADMIN_CURVE_SECRET_KEY_FILE=server_secret,
                      AIENG_OIP_REPOSITORY_CONTROL="1").start()
    http = th.InferenceServerClient(srv.oip_http)
    try:
        http.load_model("tabular", config=V2)
        assert index(http) == {("tabular", "1"): ("READY", ""), ("tabular", "2"): ("READY", "")}
    finally:
        http.close()
