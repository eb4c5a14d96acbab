"""The native ZeroMQ protocol (docs/protocol.md) as an OpenAPI 3.0.3 document: ``/v2/native.json`` and,
written by scripts/gen_native_openapi.py with the default configuration, docs/protocol.openapi.json (a unit
test checks the committed file equals ``native_document(Config())``).

It is not HTTP: ``paths`` is empty and the messages are ``components.schemas`` (msgpack maps, described
as JSON Schema: msgpack bin is ``format: binary``), with ``x-aieng-protocol`` for what JSON Schema cannot
say: the transport, the op names, the error codes, and the limits.  Everything comes from the code's own
constants (``wire.protocol``: version, ops, error codes, dtypes, unpack limits, key and id lengths) and the
configuration's limits (message size, timeouts, in-flight caps), so the document cannot drift from them.
"""
from __future__ import annotations

from aieng.config import Config
from aieng.wire import protocol as p

ID_CHARS = 256  # protocol.valid_id's bound
TRACE_ID_CHARS = 64
TRACESTATE_CHARS = 512
# each op's success (a new op in protocol.OPS without one here: a KeyError in the unit test)
REPLY = {"infer": "InferResponse", "health": "HealthResponse", "models": "ModelsResponse",
         "stats": "StatsResponse", "log_level": "LogLevelResponse"}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def schemas(cfg: Config) -> dict:
    binary = {"type": "string", "format": "binary"}
    any_map = {"type": "object", "additionalProperties": True}
    req_id = {"description": f"echoed; a str of <= {ID_CHARS} chars or an int (bool, float: INVALID_REQUEST)",
              "oneOf": [{"type": "string", "maxLength": ID_CHARS}, {"type": "integer"}], "nullable": True}
    return {
        "TensorMap": {"type": "object", "required": ["dtype", "shape", "data"], "properties": {
            "dtype": {"type": "string", "enum": [*p.DTYPES, p.BYTES]},
            "shape": {"type": "array", "maxItems": p.MAX_TENSOR_DIMS,
                      "items": {"type": "integer", "minimum": 0}},
            "data": {"description": "numbers: bin, little endian, C order; bytes: an array of bin (or str)",
                     "oneOf": [binary, {"type": "array", "items": {"type": "string"}}]}}},
        "InputValue": {"description": "by the input's kind: text (str), image (bin: JPEG or PNG), number "
                                      "(int, float or nil), category (str or nil), tensor (a tensor map)",
                       "nullable": True,
                       "oneOf": [{"type": "string"}, binary, {"type": "number"}, _ref("TensorMap")]},
        "Request": {"type": "object",
                    "description": "one msgpack map in one ZMQ frame; unknown fields ignored",
                    "properties": {
                        "op": {"type": "string", "enum": list(p.OPS), "default": "infer"},
                        "id": req_id,
                        "model": {"type": "string", "description": "required for infer"},
                        "version": {"type": "string", "nullable": True},
                        "routing_key": {"oneOf": [{"type": "string", "minLength": 1,
                                                   "maxLength": p.MAX_ROUTING_KEY_CHARS},
                                                  {"type": "integer"}],
                                        "nullable": True},
                        "inputs": {"type": "object", "additionalProperties": _ref("InputValue"),
                                   "description": "required for infer: input name -> value"},
                        "params": {**any_map, "nullable": True},
                        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": cfg.max_timeout_ms,
                                       "default": cfg.default_timeout_ms},
                        "trace_id": {"type": "string", "minLength": 1, "maxLength": TRACE_ID_CHARS},
                        "traceparent": {"type": "string"},
                        "tracestate": {"type": "string", "maxLength": TRACESTATE_CHARS},
                        "since_s": {"type": "number", "description": "stats: only the last seconds"},
                        "reset": {"type": "boolean", "description": "stats: a server-wide change"},
                        "level": {"type": "string", "enum": ["DEBUG", "INFO", "WARNING", "ERROR"],
                                  "nullable": True, "description": "log_level: a server-wide change"}}},
        "ErrorDetail": {"type": "object", "required": ["code", "message"], "properties": {
            "code": {"type": "string", "enum": list(p.ERROR_CODES)}, "message": {"type": "string"}}},
        "ErrorResponse": {"type": "object", "required": ["ok", "error"], "properties": {
            "id": req_id, "ok": {"type": "boolean", "enum": [False]}, "error": _ref("ErrorDetail"),
            "trace_id": {"type": "string"}, "model": {"type": "string"}, "version": {"type": "string"}}},
        "InferResponse": {"type": "object", "required": ["ok", "model", "version", "outputs"], "properties": {
            "id": req_id, "ok": {"type": "boolean", "enum": [True]},
            "model": {"type": "string"}, "version": {"type": "string"},
            "route": {"type": "string", "description": "pinned, rule:<name> or weight"},
            "batch": {"type": "integer", "minimum": 0}, "cached": {"type": "boolean"},
            "degraded": {"type": "integer", "minimum": 1, "maximum": 3}, "fallback": {"type": "boolean"},
            "skipped_steps": {"type": "array", "items": {"type": "string"}},
            "trace_id": {"type": "string"}, "traceparent": {"type": "string"},
            "timing_us": {"type": "object", "additionalProperties": {"type": "integer"}},
            "outputs": {"type": "object", "additionalProperties": {
                "oneOf": [{"type": "string"}, {"type": "number"}, {"type": "array", "items": {}},
                          _ref("TensorMap")]}}}},
        "HealthResponse": {"type": "object", "required": ["ok", "live", "ready"], "properties": {
            "ok": {"type": "boolean"}, "live": {"type": "boolean"}, "ready": {"type": "boolean"},
            "protocol": {"type": "integer", "enum": [p.PROTOCOL_VERSION]}}, "additionalProperties": True},
        "ModelsResponse": {"type": "object", "required": ["ok", "models"], "properties": {
            "ok": {"type": "boolean"}, "models": any_map}},
        "StatsResponse": {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}},
                          "additionalProperties": True},
        "LogLevelResponse": {"type": "object", "required": ["ok", "level"], "properties": {
            "ok": {"type": "boolean"}, "level": {"type": "string"}}},
    }


def native_document(cfg: Config) -> dict:
    limits = {"max_message_bytes": cfg.max_message_bytes, "max_timeout_ms": cfg.max_timeout_ms,
              "default_timeout_ms": cfg.default_timeout_ms, "max_inflight": cfg.max_inflight,
              "max_inflight_per_client": cfg.max_inflight_per_client, "max_ops_per_s": cfg.max_ops_per_s,
              "max_tensor_dims": p.MAX_TENSOR_DIMS, "max_routing_key_chars": p.MAX_ROUTING_KEY_CHARS,
              "max_id_chars": ID_CHARS, "msgpack": p.unpack_limits(cfg.max_message_bytes)}
    return {
        "openapi": "3.0.3",
        "info": {"title": "aieng native protocol (ZeroMQ + msgpack)", "version": str(p.PROTOCOL_VERSION),
                 "description": "Not HTTP: one msgpack map per request and per response over a ZMQ ROUTER "
                                "socket (AIENG_FRONTEND_ADDR). The messages are the schemas below; "
                                "docs/protocol.md is the prose."},
        "paths": {},
        "x-aieng-protocol": {
            "version": p.PROTOCOL_VERSION,
            "transport": "ZeroMQ ROUTER (REQ or DEALER clients), one frame each",
            "encoding": "msgpack (bin for bytes, str for text; no ext types)",
            "ops": {op: {"request": "Request", "response": REPLY[op], "error": "ErrorResponse"}
                    for op in p.OPS},
            "error_codes": list(p.ERROR_CODES),
            "transient_codes": [p.TIMEOUT, p.OVERLOADED, p.UNAVAILABLE],
            "limits": limits},
        "components": {"schemas": schemas(cfg)},
    }
