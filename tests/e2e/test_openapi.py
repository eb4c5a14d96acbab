"""The OpenAPI documents and Swagger UI's files from a running server (issue 38): a server with four kinds of
model (text minilm, image orientation, tabular, and a tensor model of the test's own) serves
/v2/openapi.json, each model's /v2/models/NAME/openapi.json and /v2/native.json, each valid OpenAPI 3
(openapi-spec-validator), naming the served models and each model's declared inputs; the example request of
the tensor model's document is answered by its infer; repository load/unload are documented only with
AIENG_OIP_REPOSITORY_CONTROL; with API keys on every document needs the key (401 without) while the page
shells stay open; AIENG_OIP_DOCS=0 makes every one of these paths unknown (404)."""
from __future__ import annotations

import json
import os

import pytest
from onnx import TensorProto, helper
from openapi_spec_validator import validate

from aieng.config import Config
from aieng.gateway.nativedoc import native_document
from tests.conftest import MODELS, save_tensor_model
from tests.e2e.oip_get import oip_get

pytestmark = pytest.mark.e2e

KEY = "docs-key-0123456789abcdef0"
REFUSED = "a valid API key is needed: Authorization: Bearer <key>"
PATHS = ("/v2/openapi.json", "/v2/native.json", "/v2/docs", "/v2/docs/static/swagger-ui.css",
         "/v2/models/tabular/openapi.json", "/v2/models/tabular/docs")


get = oip_get  # (status, headers, body) of one request to the OIP port


def repo_with_a_tensor_model(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("minilm", "orientation", "tabular"):
        (repo / name).symlink_to(os.path.join(MODELS, name), target_is_directory=True)
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "adder",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    save_tensor_model(repo, "adder", graph)
    return repo


def test_documents_from_a_server_with_four_kinds_of_model_validate_and_say_what_is_served(make_server,
                                                                                          tmp_path):
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo_with_a_tensor_model(tmp_path)),
                      AIENG_MAX_MESSAGE_BYTES=str(8 << 20)).start()
    status, head, body = get(srv, "/v2/openapi.json")
    assert (status, head["content-type"]) == (200, "application/json")
    whole = json.loads(body)
    validate(whole)
    served = ["adder", "minilm", "orientation", "tabular"]
    assert whole["paths"]["/v2/models/{model_name}/infer"]["parameters"][0]["schema"]["enum"] == served
    assert not [p for p in whole["paths"] if p.startswith("/v2/repository/models")]
    assert "securitySchemes" not in whole["components"]
    assert "access-control-allow-origin" not in head
    listed = {}  # name -> (its metadata's input names, the input schemas its document names)
    for name in served:
        status, _, body = get(srv, f"/v2/models/{name}/openapi.json")
        assert status == 200, body
        doc = json.loads(body)
        validate(doc)
        assert doc["x-aieng-model"]["versions"] == ["1"]
        meta = json.loads(get(srv, f"/v2/models/{name}")[2])
        schemas = doc["components"]["schemas"]
        listed[name] = ([i["name"] for i in meta["inputs"]],
                        [k.rsplit(".", 1)[1] for k in schemas if k.startswith(f"{name}.input.")])
    assert {name: names for name, (names, _) in listed.items()} == {name: documented for name, (_, documented)
                                                                    in listed.items()}
    assert (listed["minilm"][1], listed["orientation"][1], listed["adder"][1]) == (["text"], ["image"], ["x"])
    assert {"bill_length_mm", "island"} <= set(listed["tabular"][1])
    status, _, body = get(srv, "/v2/native.json")
    native = json.loads(body)
    validate(native)
    assert native == native_document(Config(max_message_bytes=8 << 20))
    assert get(srv, "/v2/models/nope/openapi.json")[0::2] == (
        404, json.dumps({"error": "Request for unknown model: 'nope' is not found"}).encode())
    assert get(srv, "/v2/models/nope/docs")[0] == 404


def test_the_tensor_models_documented_example_is_answered_by_its_infer(make_server, tmp_path):
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo_with_a_tensor_model(tmp_path)),
                      AIENG_MODELS="adder").start()
    doc = json.loads(get(srv, "/v2/models/adder/openapi.json")[2])
    example = doc["components"]["schemas"]["adder.InferRequest"]["example"]
    status, _, body = get(srv, "/v2/models/adder/infer", body=json.dumps(example).encode())
    assert status == 200, body
    out = json.loads(body)["outputs"][0]
    assert (out["name"], out["datatype"], out["data"]) == ("y", "FP32", [1.0, 1.0, 1.0])


def test_with_keys_the_documents_need_the_key_the_shells_do_not_and_control_adds_load(make_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"alice:{KEY}\nbob:bob-key-0123456789abcdef00:tabular\n")
    srv = make_server(AIENG_MODELS="tabular,orientation", AIENG_OIP_API_KEYS_FILE=str(keys),
                      AIENG_OIP_REPOSITORY_CONTROL="1").start()
    for path in ("/v2/openapi.json", "/v2/native.json", "/v2/models/tabular/openapi.json"):
        status, head, body = get(srv, path)
        assert (status, head["www-authenticate"], json.loads(body)) == (
            401, 'Bearer realm="aieng"', {"error": REFUSED}), path
    for path in ("/v2/docs", "/v2/models/tabular/docs", "/v2/models/nope/docs",
                 "/v2/docs/static/swagger-ui-bundle.js"):
        assert get(srv, path)[0] == 200, path
    whole = json.loads(get(srv, "/v2/openapi.json", KEY)[2])
    validate(whole)
    assert whole["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert {"/v2/repository/models/{model_name}/load", "/v2/repository/models/{model_name}/unload"} <= set(
        whole["paths"])
    assert whole["paths"]["/v2/health/live"]["get"]["security"] == []
    bobs = json.loads(get(srv, "/v2/openapi.json", "bob-key-0123456789abcdef00")[2])
    assert bobs["paths"]["/v2/models/{model_name}"]["parameters"][0]["schema"]["enum"] == ["tabular"]
    assert get(srv, "/v2/models/orientation/openapi.json", "bob-key-0123456789abcdef00")[0] == 404
    validate(json.loads(get(srv, "/v2/models/orientation/openapi.json", KEY)[2]))


def test_docs_off_makes_every_docs_path_unknown(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_OIP_DOCS="0").start()
    for path in PATHS:
        assert get(srv, path)[0] == 404, path
    assert get(srv, "/v2/models/tabular")[0] == 200
