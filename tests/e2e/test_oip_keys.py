"""API keys on the OIP doors and fair shares per principal (issue 37), against the real server.

The key file names three principals: ``alice`` (every model), ``bob`` (only tabular) and, after a rewrite at
run time, ``carol``.  Clients are tritonclient over HTTP and gRPC (``headers=``), curl and grpcio: without a
key or with a wrong one they are refused (401 with ``WWW-Authenticate: Bearer`` / UNAUTHENTICATED) in the
same words whatever the model; health stays open; bob's view of orientation is an unknown model's.  The
flood: alice keeps 64 requests of 32 rows in flight over gRPC while bob, from the same address, sends one
request at a time and gets every answer (the gateway's row budget counts per principal; counted per
address, as before, bob's requests were refused with alice's).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.conftest import MODELS, ROOT
from tests.e2e.grpc_flood import GrpcFlood, one_at_a_time
from tests.e2e.tabular_oip import http_input
from tests.waits import until

pytestmark = pytest.mark.e2e

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
CAROL = "carol-key-0123456789abcdef"
REFUSED = "a valid API key is needed: Authorization: Bearer <key>"
CURL = "/usr/bin/curl"


def key_file(tmp_path, text: str):
    path = tmp_path / "oip-keys"
    path.write_text(text)
    return path


def rewrite(path, text: str) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)  # as a Kubernetes Secret's update does: a new file in place


def curl(srv, path: str, token: str | None = None, body: str | None = None) -> tuple[int, dict, str]:
    """(status, headers lower-cased, body) of one request by curl."""
    args = [CURL, "-sS", "-i", "--max-time", "20"]
    if token is not None:
        args += ["-H", f"Authorization: Bearer {token}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", body]
    out = subprocess.run(args + [f"http://{srv.oip_http}{path}"], capture_output=True, text=True, timeout=30)
    head, _, text = out.stdout.replace("\r\n", "\n").partition("\n\n")
    lines = head.split("\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, text


def tabular_body(i: int = 0) -> str:
    return json.dumps({"id": f"r{i}", "inputs": [{"name": "bill_length_mm", "datatype": "FP32", "shape": [1],
                                                  "data": [40.0 + i]}]})


def bearer(key: str) -> dict:
    """tritonclient's ``headers=``: HTTP header names are any case; gRPC's metadata keys must be lower case
    (grpc refuses ``Authorization`` in the client: "Illegal header key"), so the one spelling for both."""
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def keyed(make_server, tmp_path):
    path = key_file(tmp_path, f"# tenants\nalice:{ALICE}\nbob:{BOB}:tabular\n")
    srv = make_server(AIENG_MODELS="tabular,orientation", AIENG_OIP_API_KEYS_FILE=str(path)).start()
    return srv, path


def test_curl_without_or_with_a_wrong_key_is_refused_alike_and_health_stays_open(keyed):
    srv, _ = keyed
    paths = ["/v2/models/tabular", "/v2/models/nope", "/v2/models/tabular/ready", "/v2", "/v2/models/stats",
             "/nowhere"]
    for path in paths:
        assert curl(srv, path)[0::2] == (401, json.dumps({"error": REFUSED})), path
        assert curl(srv, path)[1]["www-authenticate"] == 'Bearer realm="aieng"'
        status, headers, text = curl(srv, path, "wrong-key-0123456789abcdef")
        assert (status, headers["www-authenticate"], text) == (
            401, 'Bearer realm="aieng", error="invalid_token"', json.dumps({"error": REFUSED})), path
    for body_model in ("tabular", "nope"):  # an infer, known model or not: the same 401
        status, _, text = curl(srv, f"/v2/models/{body_model}/infer", None, tabular_body())
        assert (status, text) == (401, json.dumps({"error": REFUSED}))
    assert [curl(srv, p)[0] for p in ("/v2/health/live", "/v2/health/ready")] == [200, 200]
    status, _, text = curl(srv, "/v2/models/tabular/infer", ALICE, tabular_body(7))
    assert (status, json.loads(text)["id"]) == (200, "r7")


def test_tritonclient_http_and_grpc_with_headers(keyed):
    srv, _ = keyed
    http = th.InferenceServerClient(srv.oip_http)
    g = tg.InferenceServerClient(srv.oip_grpc)
    try:
        assert http.is_server_live() and http.is_server_ready()  # open, no key
        assert g.is_server_live() and g.is_server_ready()
        with pytest.raises(InferenceServerException) as info:
            http.get_model_metadata("tabular")
        assert (info.value.status(), info.value.message()) == ("401", REFUSED)
        for call in (lambda: g.get_model_metadata("tabular"), lambda: g.is_model_ready("tabular"),
                     lambda: g.get_model_metadata("tabular", headers=bearer("wrong-key-0123456789abcdef")),
                     lambda: g.infer("nope", [http_input(tg)])):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert (info.value.status(), info.value.message()) == ("StatusCode.UNAUTHENTICATED", REFUSED)
        for mod, client in ((th, http), (tg, g)):
            assert client.is_model_ready("tabular", headers=bearer(ALICE))
            assert client.is_model_ready("orientation", headers=bearer(ALICE))
            res = client.infer("tabular", [http_input(mod)], request_id="a1", headers=bearer(ALICE))
            assert res.as_numpy("probabilities").shape == (1, 3)
            rid = res.get_response()["id"] if mod is th else res.get_response().id
            assert rid == "a1"
    finally:
        http.close()
        g.close()


def test_a_model_outside_the_allow_list_answers_as_an_unknown_one(keyed):
    srv, _ = keyed
    http = th.InferenceServerClient(srv.oip_http)
    g = tg.InferenceServerClient(srv.oip_grpc)
    try:
        def http_error(call) -> tuple[str, str]:
            with pytest.raises(InferenceServerException) as info:
                call()
            return info.value.status(), info.value.message().replace("orientation", "X").replace("nope", "X")

        for name in ("orientation", "nope"):
            assert http.is_model_ready(name, headers=bearer(BOB)) is False
            assert g.is_model_ready(name, headers=bearer(BOB)) is False
        for call in (lambda n: http.get_model_metadata(n, headers=bearer(BOB)),
                     lambda n: http.get_model_config(n, headers=bearer(BOB)),
                     lambda n: http.infer(n, [http_input(th)], headers=bearer(BOB)),
                     lambda n: g.get_model_metadata(n, headers=bearer(BOB)),
                     lambda n: g.get_model_config(n, headers=bearer(BOB)),
                     lambda n: g.get_inference_statistics(n, headers=bearer(BOB)),
                     lambda n: g.infer(n, [http_input(tg)], headers=bearer(BOB))):
            hidden, unknown = http_error(lambda: call("orientation")), http_error(lambda: call("nope"))
            assert hidden == unknown and "unknown model: 'X'" in hidden[1], (hidden, unknown)
        status, _, text = curl(srv, "/v2/models/orientation/versions/1", BOB)
        want = "Request for unknown model: 'orientation' version 1 is not found"
        assert (status, text) == (404, json.dumps({"error": want}))
        assert [m["name"] for m in http.get_model_repository_index(headers=bearer(BOB))] == ["tabular"]
        assert [m.name for m in g.get_model_repository_index(headers=bearer(BOB)).models] == ["tabular"]
        assert [m["name"] for m in http.get_inference_statistics(headers=bearer(BOB))["model_stats"]] \
            == ["tabular"]
        assert [m.name for m in g.get_inference_statistics(headers=bearer(BOB)).model_stats] == ["tabular"]
        assert sorted(m["name"] for m in http.get_model_repository_index(headers=bearer(ALICE))) \
            == ["orientation", "tabular"]
        res = http.infer("tabular", [http_input(th)], headers=bearer(BOB))
        assert res.as_numpy("probabilities").shape == (1, 3)
    finally:
        http.close()
        g.close()


def test_a_rewritten_key_file_takes_effect_without_a_restart(keyed):
    srv, path = keyed
    assert curl(srv, "/v2/models/tabular", ALICE)[0] == 200
    assert curl(srv, "/v2/models/tabular", CAROL)[0] == 401
    rewrite(path, f"bob:{BOB}:tabular\ncarol:{CAROL}\n")
    assert until(lambda: curl(srv, "/v2/models/tabular", CAROL)[0] == 200, 10, 0.1)
    assert curl(srv, "/v2/models/tabular", ALICE)[0] == 401
    g = tg.InferenceServerClient(srv.oip_grpc)
    try:
        assert g.get_model_metadata("tabular", headers=bearer(CAROL)).name == "tabular"
        with pytest.raises(InferenceServerException) as info:
            g.get_model_metadata("tabular", headers=bearer(ALICE))
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        rewrite(path, f"carol:{CAROL}\nbroken line\n")  # a broken rewrite keeps the last good keys
        assert until(lambda: "keeping the last good keys" in srv.output(), 10, 0.1)
        assert "AIENG_OIP_API_KEYS_FILE: " + str(path) + " line 2: 1 ':'-separated fields" in srv.output()
        assert curl(srv, "/v2/models/tabular", BOB)[0] == 200
        assert g.get_model_metadata("tabular", headers=bearer(CAROL)).name == "tabular"
    finally:
        g.close()


def test_two_keys_from_one_address_each_keep_their_share(make_server, tmp_path):
    path = key_file(tmp_path, f"alice:{ALICE}\nbob:{BOB}\n")
    srv = make_server(AIENG_MODELS="tabular", AIENG_OIP_API_KEYS_FILE=str(path)).start()
    key = (("authorization", f"Bearer {ALICE}"),)
    with GrpcFlood(lambda: grpc.insecure_channel(srv.oip_grpc), key) as alice:
        assert alice.bites()
        # the same address as alice (127.0.0.1)
        answered = one_at_a_time(tg.InferenceServerClient(srv.oip_grpc), headers=bearer(BOB))
    assert answered == [f"b{i}" for i in range(40)]
    assert alice.refused_for_its_share(), alice.refused()[:3]
    assert {code for code, _ in alice.outcomes} == {"OK", "UNAVAILABLE"}


def test_a_malformed_key_file_stops_the_start_with_one_line(tmp_path):
    path = key_file(tmp_path, f"alice:{ALICE}\n\n# fine so far\nbob {BOB}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_MODEL_REPOSITORY=MODELS, AIENG_OIP_API_KEYS_FILE=str(path))
    out = subprocess.run([sys.executable, "-m", "aieng.cli", "serve"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    want = (f"aieng: AIENG_OIP_API_KEYS_FILE: {path} line 4: 1 ':'-separated fields (expected PRINCIPAL:KEY "
            f"or PRINCIPAL:KEY:model_a,model_b)\n")
    assert (out.returncode, out.stderr) == (2, want)
