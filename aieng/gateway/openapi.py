"""The OpenAPI 3.0.3 document of the OIP HTTP API as this gateway serves it (``/v2/openapi.json``).

Built per request from what ``http.py`` routes and what the server holds now, never kept by hand:
``ApiShape`` says which optional parts are served (repository load/unload only with
AIENG_OIP_REPOSITORY_CONTROL; the bearer scheme only with AIENG_OIP_API_KEYS_FILE, server live/ready then
marked open) and ``models`` the names a caller may see (the ``model_name`` parameter's enum).  The error
bodies are ``{"error": ...}`` with the statuses ``service.HTTP_STATUS`` maps the codes to.  The shared
schemas (``components``) are reused by the per-model documents (``modeldoc.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aieng.gateway.codec import DATATYPES

VERSION = "3.0.3"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
HEADER_LEN = "Inference-Header-Content-Length"
BINARY_WORDS = ("The binary tensor data extension: the JSON header first, then each binary tensor's raw "
                "little-endian bytes in order (BYTES elements each as a 4-byte little-endian length and "
                f"its bytes); `{HEADER_LEN}` gives the JSON header's length and each binary tensor says its "
                "size in `parameters.binary_data_size`.")
# why each status is answered (service.HTTP_STATUS's codes); an operation lists the ones it can give
WHY = {400: "INVALID_REQUEST or INVALID_INPUT: the request or an input is wrong",
       401: "no valid API key (`Authorization: Bearer <key>`; `WWW-Authenticate: Bearer`)",
       403: "PERMISSION_DENIED", 404: "MODEL_NOT_FOUND (Triton's words: `Request for unknown model: ...`) "
       "or an unknown path", 405: "the method is not served on this path",
       429: "shared memory bounds exhausted", 500: "INTERNAL", 501: "UNSUPPORTED",
       503: "OVERLOADED or UNAVAILABLE (not ready, a version that failed to load)", 504: "TIMEOUT"}


@dataclass(frozen=True)
class ApiShape:
    """What the whole-API document shows: the parts of the API this gateway serves and the models the caller
    may see (an API key's allow-list applied)."""
    models: tuple[str, ...]
    repository_control: bool = False
    keys: bool = False
    version: str = ""


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(schema: dict, description: str = "") -> dict:
    return {"description": description or "JSON", "content": {JSON_TYPE: {"schema": schema}}}


def errors(*statuses: int) -> dict:
    return {str(s): {"description": WHY[s], "content": {JSON_TYPE: {"schema": ref("Error")}}}
            for s in statuses}


def operation(summary: str, ok: dict, *statuses: int, tags: tuple[str, ...] = (), **more: Any) -> dict:
    op = {"summary": summary, "responses": {"200": ok, **errors(*statuses)}, **more}
    if tags:
        op["tags"] = list(tags)
    return op


def tensor_schemas() -> dict:
    """The OIP message schemas every document shares (KServe v2 / Triton's JSON)."""
    params = {"type": "object", "additionalProperties": True}
    tensor = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": list(DATATYPES)}, "parameters": params,
        "data": {"type": "array", "items": {}, "description": "row-major, flat or nested; BYTES as strings"}}}
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "Parameters": params,
        "InferInput": tensor,
        "InferOutputRequest": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "parameters": params}},
        "InferRequest": {"type": "object", "required": ["inputs"], "properties": {
            "id": {"type": "string"}, "parameters": params,
            "inputs": {"type": "array", "items": ref("InferInput")},
            "outputs": {"type": "array", "items": ref("InferOutputRequest")}}},
        "InferOutput": tensor,
        "InferResponse": {"type": "object", "required": ["model_name", "outputs"], "properties": {
            "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
            "parameters": params, "outputs": {"type": "array", "items": ref("InferOutput")}}},
        "MetadataTensor": {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
            "name": {"type": "string"}, "datatype": {"type": "string", "enum": list(DATATYPES)},
            "shape": {"type": "array", "items": {"type": "integer"}, "description": "-1: a variable axis"}}},
        "ModelMetadata": {"type": "object", "required": ["name", "platform", "inputs", "outputs"],
                          "properties": {"name": {"type": "string"},
                                         "versions": {"type": "array", "items": {"type": "string"}},
                                         "platform": {"type": "string"},
                                         "inputs": {"type": "array", "items": ref("MetadataTensor")},
                                         "outputs": {"type": "array", "items": ref("MetadataTensor")}}},
        "ServerMetadata": {"type": "object", "required": ["name", "version", "extensions"], "properties": {
            "name": {"type": "string"}, "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}}}},
        "ModelConfig": {"type": "object", "description": "Triton's model configuration (JSON form)",
                        "additionalProperties": True},
        "ModelStats": {"type": "object", "properties": {"model_stats": {"type": "array", "items": {
            "type": "object", "additionalProperties": True}}}},
        "RepositoryIndex": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "version": {"type": "string"}, "state": {"type": "string"},
            "reason": {"type": "string"}}}},
        "LogSettings": {"type": "object", "additionalProperties": True},
        "ShmStatus": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
        "ShmRegister": {"type": "object", "properties": {
            "key": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 0}}},
    }


def infer_operation(request: str, response: str, summary: str) -> dict:
    """POST infer: a JSON body, or the binary extension's (JSON header + raw bytes)."""
    header = {"name": HEADER_LEN, "in": "header", "required": False,
              "schema": {"type": "integer", "minimum": 0},
              "description": "with a binary body: the JSON header's length in bytes"}
    binary = {"schema": {"type": "string", "format": "binary"}}
    ok = {"description": "the outputs; binary ones after the JSON header (" + HEADER_LEN + " says where)",
          "headers": {HEADER_LEN: {"schema": {"type": "integer"}, "description": "binary answers only"}},
          "content": {JSON_TYPE: {"schema": ref(response)}, BINARY_TYPE: binary}}
    return operation(summary, ok, 400, 404, 429, 500, 501, 503, 504, tags=("inference",),
                     description=BINARY_WORDS, parameters=[header],
                     requestBody={"required": True, "content": {JSON_TYPE: {"schema": ref(request)},
                                                                BINARY_TYPE: binary}})


def path_param(name: str, values: tuple[str, ...] = (), what: str = "") -> dict:
    schema: dict = {"type": "string"}
    if values:
        schema["enum"] = list(values)
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": what}


def model_paths(prefix: str, params: list[dict], infer: dict) -> dict:
    """The per-model routes under ``prefix`` (``/v2/models/{model_name}`` and its versions)."""
    empty = {"description": "ready (an empty body)"}
    return {
        prefix: {"parameters": params, "get": operation(
            "Model metadata", json_body(ref("ModelMetadata")), 404, 503, tags=("model",))},
        prefix + "/ready": {"parameters": params, "get": operation(
            "Model ready", empty, 404, 503, tags=("model",))},
        prefix + "/config": {"parameters": params, "get": operation(
            "Triton model configuration", json_body(ref("ModelConfig")), 404, 503, tags=("model",))},
        prefix + "/stats": {"parameters": params, "get": operation(
            "Model statistics", json_body(ref("ModelStats")), 404, 500, tags=("statistics",))},
        prefix + "/infer": {"parameters": params, "post": infer},
    }


def _shm_paths(kind: str, words: str) -> dict:
    base, region = f"/v2/{kind}", [path_param("region_name", what="the region's name")]
    tag, empty = ("shared memory",), {"description": "done (an empty body)"}
    return {
        base + "/status": {"get": operation(f"{words} regions", json_body(ref("ShmStatus")), 403, tags=tag)},
        base + "/region/{region_name}/status": {"parameters": region, "get": operation(
            f"One {words} region", json_body(ref("ShmStatus")), 403, 404, tags=tag)},
        base + "/region/{region_name}/register": {"parameters": region, "post": operation(
            f"Register a {words} region", empty, 400, 403, 429, tags=tag,
            requestBody=json_body(ref("ShmRegister")))},
        base + "/region/{region_name}/unregister": {"parameters": region, "post": operation(
            f"Unregister a {words} region", empty, 403, 404, tags=tag)},
        base + "/unregister": {"post": operation(f"Unregister every {words} region of the caller", empty,
                                                 403, tags=tag)},
    }


def server_document(shape: ApiShape) -> dict:
    """The whole OIP HTTP API of this gateway."""
    names = path_param("model_name", shape.models, "a served model")
    version = path_param("model_version", what="a version's directory name, e.g. 1")
    paths: dict = {
        "/v2": {"get": operation("Server metadata", json_body(ref("ServerMetadata")), tags=("server",))},
        "/v2/health/live": {"get": operation("Server live", {"description": "live (an empty body)"}, 503,
                                             tags=("health",))},
        "/v2/health/ready": {"get": operation("Server ready", {"description": "ready (an empty body)"}, 503,
                                              tags=("health",))},
        "/v2/models/stats": {"get": operation("Every model's statistics", json_body(ref("ModelStats")), 500,
                                              tags=("statistics",))},
    }
    infer = infer_operation("InferRequest", "InferResponse", "Infer")
    paths.update(model_paths("/v2/models/{model_name}", [names], infer))
    paths.update(model_paths("/v2/models/{model_name}/versions/{model_version}", [names, version], infer))
    paths["/v2/repository/index"] = {"post": operation(
        "The repository's models and versions", json_body(ref("RepositoryIndex")), tags=("repository",))}
    if shape.repository_control:
        for action in ("load", "unload"):
            path = f"/v2/repository/models/{{model_name}}/{action}"
            paths[path] = {"parameters": [names], "post": operation(
                f"{action.capitalize()} a model (admin: AIENG_OIP_REPOSITORY_CONTROL)",
                json_body({"type": "object"}), 400, 403, 404, 503, tags=("repository",),
                requestBody={"required": False, **json_body({"type": "object", "properties": {
                    "parameters": ref("Parameters")}})})}
    paths["/v2/logging"] = {
        "get": operation("Log settings", json_body(ref("LogSettings")), tags=("logging",)),
        "post": operation("Change log settings (AIENG_OIP_LOGGING_CONTROL)", json_body(ref("LogSettings")),
                          400, 403, tags=("logging",), requestBody=json_body(ref("LogSettings")))}
    paths.update(_shm_paths("systemsharedmemory", "system shared memory"))
    paths.update(_shm_paths("cudasharedmemory", "CUDA shared memory"))
    paths.update(document_paths(names))
    doc = {"openapi": VERSION,
           "info": {"title": "aieng: Open Inference Protocol (HTTP/REST)", "version": shape.version or "0",
                    "description": "KServe v2 / Triton HTTP API as this aieng server serves it "
                                   "(docs/oip.md). "
                                   "Errors are `{\"error\": \"...\"}`."},
           "tags": [{"name": t} for t in TAGS], "paths": paths, "components": {"schemas": tensor_schemas()}}
    return secure(doc, shape.keys)


def document_paths(names: dict) -> dict:
    """These documents' own routes (and the Swagger UI pages, open: shells that reveal nothing)."""
    doc, page = json_body({"type": "object"}, "an OpenAPI 3 document"), {
        "description": "Swagger UI", "content": {"text/html": {"schema": {"type": "string"}}}}
    return {
        "/v2/openapi.json": {"get": operation("This document", doc, tags=("docs",))},
        "/v2/native.json": {"get": operation("The native ZeroMQ protocol's document", doc, tags=("docs",))},
        "/v2/models/{model_name}/openapi.json": {"parameters": [names], "get": operation(
            "One model's document", doc, 404, 503, tags=("docs",))},
        "/v2/docs": {"get": operation("Swagger UI of the whole API", page, tags=("docs",), security=[])},
        "/v2/models/{model_name}/docs": {"parameters": [names], "get": operation(
            "Swagger UI of one model", page, 404, tags=("docs",), security=[])},
    }


# the order Swagger UI shows the groups in: what a newcomer looks for first
TAGS = ("inference", "model", "server", "health", "statistics", "repository", "logging", "shared memory",
        "docs")
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")


def secure(doc: dict, keys: bool) -> dict:
    """With API keys on: the bearer scheme on every operation but server live/ready (and the UI pages, which
    carry ``security: []`` already), each such operation answering 401 too; without, no page is marked."""
    if not keys:
        for item in doc["paths"].values():
            for op in item.values():
                if isinstance(op, dict) and op.get("security") == []:
                    del op["security"]
        return doc
    doc["components"]["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer", "description": "an API key of AIENG_OIP_API_KEYS_FILE"}}
    doc["security"] = [{"bearer": []}]
    for path, item in doc["paths"].items():
        for op in item.values():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            if path in OPEN_PATHS:
                op["security"] = []
            elif op.get("security") != []:
                op["responses"]["401"] = errors(401)["401"]
    return doc
