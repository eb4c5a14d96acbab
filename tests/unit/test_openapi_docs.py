"""The OpenAPI documents (issue 38): the whole OIP HTTP API (gateway/openapi.py) in each shape the server can
take, one model's (gateway/modeldoc.py) for the demo models' real specs and a tensor model, and the native
protocol's (gateway/nativedoc.py), each validated against the OpenAPI 3 schema by openapi-spec-validator;
the committed docs/protocol.openapi.json is what scripts/gen_native_openapi.py writes; the docs routes'
matcher and static allow-list (gateway/docs.py)."""
import asyncio
import json
import os

import pytest
from openapi_spec_validator import validate

from aieng.config import Config
from aieng.gateway import docs
from aieng.gateway.modeldoc import model_document
from aieng.gateway.models import build_view
from aieng.gateway.nativedoc import native_document
from aieng.gateway.openapi import ApiShape, server_document
from aieng.httpcore.message import HttpError
from aieng.models import repo as model_repo
from aieng.wire import protocol as p
from tests.conftest import MODELS, ROOT


def demo_views() -> dict:
    found = model_repo.scan(MODELS)
    return {name: build_view(name, found[name]["1"].public(), found[name]["1"].batching)
            for name in ("minilm", "orientation", "tabular")}


def tensor_view():
    pub = {"version": "2", "description": "adds one", "metadata": {"owner": "tests"}, "max_batch_size": 1,
           "inputs": [{"name": "x:0", "kind": "tensor", "dtype": "float32", "shape": [3]}],
           "outputs": [{"name": "y", "kind": "tensor", "dtype": "int64", "shape": [3]}]}
    return build_view("add.one", pub, None)


def ops(doc: dict) -> set[tuple[str, str]]:
    return {(path, method) for path, item in doc["paths"].items() for method in item
            if method != "parameters"}


@pytest.mark.parametrize("control,keys", [(False, False), (True, False), (False, True), (True, True)])
def test_the_whole_api_document_validates_in_every_shape(control, keys):
    doc = server_document(ApiShape(("minilm", "tabular"), control, keys, "0.1.0"))
    validate(doc)
    load = ("/v2/repository/models/{model_name}/load", "post")
    assert (load in ops(doc)) is control
    assert ("/v2/repository/index", "post") in ops(doc)
    assert ("securitySchemes" in doc["components"]) is keys
    infer = doc["paths"]["/v2/models/{model_name}/infer"]
    assert infer["parameters"][0]["schema"]["enum"] == ["minilm", "tabular"]
    body = infer["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/octet-stream"}
    assert infer["post"]["parameters"][0]["name"] == "Inference-Header-Content-Length"
    assert ("401" in infer["post"]["responses"]) is keys
    assert doc["paths"]["/v2/models/{model_name}/ready"]["get"]["responses"]["404"]["content"][
        "application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


def test_with_keys_server_live_and_ready_and_the_pages_are_open_and_the_rest_needs_the_bearer_key():
    doc = server_document(ApiShape(("tabular",), keys=True))
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "an API key of AIENG_OIP_API_KEYS_FILE"}
    assert doc["security"] == [{"bearer": []}]
    opened = {(path, m) for path, item in doc["paths"].items() for m, op in item.items()
              if m != "parameters" and op.get("security") == []}
    assert opened == {("/v2/health/live", "get"), ("/v2/health/ready", "get"), ("/v2/docs", "get"),
                      ("/v2/models/{model_name}/docs", "get")}
    assert "401" not in doc["paths"]["/v2/health/live"]["get"]["responses"]
    assert "security" not in json.dumps(server_document(ApiShape(("tabular",))))


def test_no_served_model_leaves_the_name_free_rather_than_an_empty_enum():
    doc = server_document(ApiShape(()))
    validate(doc)
    assert doc["paths"]["/v2/models/{model_name}"]["parameters"][0]["schema"] == {"type": "string"}


@pytest.mark.parametrize("name", ["minilm", "orientation", "tabular"])
def test_a_demo_models_document_validates_and_says_its_inputs_and_outputs(name):
    view = demo_views()[name]
    doc = model_document(view, ["1"])
    validate(doc)
    schemas = doc["components"]["schemas"]
    for item in view.inputs:
        got = schemas[f"{name}.input.{item['name']}"]
        assert got["properties"]["name"]["enum"] == [item["name"]]
        assert got["properties"]["datatype"]["enum"] == [item["datatype"]]
        assert got["x-shape"] == item["shape"]
    assert [o["name"] for o in view.outputs] == [
        s["properties"]["name"]["enum"][0] for k, s in schemas.items() if k.startswith(f"{name}.output.")]
    assert doc["info"]["version"] == "1" and doc["x-aieng-model"]["versions"] == ["1"]
    assert f"/v2/models/{name}/infer" in doc["paths"]


def test_minilms_example_request_is_its_text_input():
    doc = model_document(demo_views()["minilm"], ["1"])
    example = doc["components"]["schemas"]["minilm.InferRequest"]["example"]
    assert [(i["name"], i["datatype"], i["shape"]) for i in example["inputs"]] == [("text", "BYTES", [1])]


def test_a_tensor_models_document_has_its_shapes_description_and_metadata():
    doc = model_document(tensor_view(), ["2", "10"], keys=True)
    validate(doc)
    x = doc["components"]["schemas"]["add.one.input.x_0"]
    assert (x["x-shape"], x["properties"]["datatype"]["enum"]) == ([3], ["FP32"])
    assert doc["components"]["schemas"]["add.one.InferRequest"]["example"] == {
        "inputs": [{"name": "x:0", "datatype": "FP32", "shape": [3], "data": [0.0, 0.0, 0.0]}]}
    assert doc["info"]["description"].startswith("adds one")
    assert doc["x-aieng-model"]["metadata"] == {"owner": "tests"}
    version = doc["paths"]["/v2/models/add.one/versions/{model_version}/infer"]["parameters"][0]
    assert version["schema"]["enum"] == ["2", "10"]
    assert doc["security"] == [{"bearer": []}]


def test_the_native_document_validates_and_comes_from_the_protocols_constants():
    doc = native_document(Config(max_message_bytes=1 << 20))
    validate(doc)
    x = doc["x-aieng-protocol"]
    assert list(x["ops"]) == list(p.OPS) and x["error_codes"] == list(p.ERROR_CODES)
    assert x["limits"]["max_message_bytes"] == 1 << 20
    assert x["limits"]["msgpack"] == p.unpack_limits(1 << 20)
    req = doc["components"]["schemas"]["Request"]["properties"]
    assert req["timeout_ms"]["maximum"] == Config().max_timeout_ms
    assert doc["components"]["schemas"]["TensorMap"]["properties"]["dtype"]["enum"] == [*p.DTYPES, "bytes"]


def test_the_committed_native_document_is_the_generated_one():
    with open(os.path.join(ROOT, "docs", "protocol.openapi.json"), encoding="utf-8") as f:
        committed = json.load(f)
    assert committed == native_document(Config()), \
        "regenerate with: PYTHONPATH=. python scripts/gen_native_openapi.py"


def test_the_docs_routes_are_matched_exactly_and_infer_is_not():
    for path in ("/v2/openapi.json", "/v2/native.json", "/v2/docs", "/v2/docs/static/swagger-ui.css",
                 "/v2/models/minilm/openapi.json", "/v2/models/minilm/docs"):
        assert docs.owns([s for s in path.split("/") if s]), path
    for path in ("/v2/models/minilm/infer", "/v2/models/docs", "/v2/models/minilm", "/v2", "/docs",
                 "/v2/models/minilm/versions/1/docs", "/v2/docs/static", "/v1/docs/static/x.css"):
        assert not docs.owns([s for s in path.split("/") if s]), path


def test_every_allowed_static_file_is_served_with_its_type_and_nothing_else_is():
    routes = docs.DocsRoutes(None, None, Config())  # the static files need no service
    for name, (_, ctype, cache) in docs.STATIC.items():
        status, head, body = asyncio.run(routes.handle("GET", ["v2", "docs", "static", name], {}))
        assert (status, head["Content-Type"], head["Cache-Control"]) == (200, ctype, cache)
        assert len(body) > 100, name
    for name in ("index.html", "swagger-ui.js.map", "..", "swagger-initializer.js"):
        with pytest.raises(HttpError) as err:
            asyncio.run(routes.handle("GET", ["v2", "docs", "static", name], {}))
        assert err.value.status == 404
    page = asyncio.run(routes.handle("GET", ["v2", "docs"], {}))
    assert page[1]["Content-Type"] == "text/html; charset=utf-8"
    assert b'src="/v2/docs/static/swagger-ui-bundle.js"' in page[2]
    assert b"://" not in page[2]  # nothing from another origin: no CDN
