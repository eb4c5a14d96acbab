"""One model's OpenAPI 3.0.3 document (``/v2/models/{name}/openapi.json``), built from its ``ModelView``.

The same view the metadata and config answers are built from (``models.py``), so the document says what
they say: each declared input and output as a schema of its own (name, datatype, shape with -1 for a
variable axis, its kind and whether it is optional), an infer request whose ``inputs`` hold those (every
required one) and a response whose ``outputs`` hold the declared outputs; the model's description, its
versions (``versions`` path parameter's enum) and its ``metadata`` map (``x-aieng-model``).  The example
request fills each JSON-expressible input (text, number, category, a small numeric tensor) so Swagger UI's
"Try it out" sends something the model takes.
"""
from __future__ import annotations

import math
import re
from typing import Any

from aieng.gateway import openapi as oa
from aieng.gateway.models import ModelView

EXAMPLE_ELEMENTS = 4096  # a tensor larger than this gets no example (a page of zeros helps nobody)
KIND_EXAMPLE = {"text": "The quick brown fox jumps over the lazy dog.", "category": "unknown"}


def _json_type(datatype: str) -> dict:
    if datatype == "BYTES":
        return {"type": "string"}
    if datatype == "BOOL":
        return {"type": "boolean"}
    return {"type": "number"} if datatype.startswith("FP") else {"type": "integer"}


def safe(name: str) -> str:
    """A component name OpenAPI allows (``^[a-zA-Z0-9.\\-_]+$``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def tensor_schema(item: dict, what: str) -> dict:
    shape = item["shape"]
    words = f"{what} {item['name']!r}: {item['datatype']}, shape {shape} (-1: a variable axis)"
    if item.get("kind"):
        words += f"; kind {item['kind']}" + ("; optional" if item.get("optional") else "")
    return {"type": "object", "description": words, "required": ["name", "datatype", "shape", "data"]
            if what == "input" else ["name", "datatype", "shape"], "x-shape": list(shape),
            "properties": {
                "name": {"type": "string", "enum": [item["name"]]},
                "datatype": {"type": "string", "enum": [item["datatype"]]},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0},
                          "minItems": len(shape), "maxItems": len(shape)},
                "parameters": oa.ref("Parameters"),
                "data": {"type": "array", "items": _json_type(item["datatype"]),
                         "description": "row-major, flat or nested"}}}


def example_input(item: dict) -> dict | None:
    """One row of ``item`` as JSON, or None where JSON cannot say it (an image is bytes: binary extension)."""
    kind, dt = item.get("kind"), item["datatype"]
    shape = [1 if d < 0 else d for d in item["shape"]]
    count = math.prod(shape)
    if kind == "image" or count > EXAMPLE_ELEMENTS:
        return None
    value: Any = KIND_EXAMPLE.get(kind or "", "")
    if kind == "number":
        value = 1.0
    elif kind == "tensor" or not kind:
        value = False if dt == "BOOL" else ("" if dt == "BYTES" else (0.0 if dt.startswith("FP") else 0))
    return {"name": item["name"], "datatype": dt, "shape": shape, "data": [value] * count}


def model_document(view: ModelView, versions: list[str], keys: bool = False) -> dict:
    """The document of ``view`` (the default version), listing every version ``versions`` names."""
    name = view.name
    schemas = oa.tensor_schemas()
    ins = [f"{safe(name)}.input.{safe(i['name'])}" for i in view.inputs]
    outs = [f"{safe(name)}.output.{safe(o['name'])}" for o in view.outputs]
    for key, item in zip(ins, view.inputs):
        schemas[key] = tensor_schema(item, "input")
    for key, item in zip(outs, view.outputs):
        schemas[key] = tensor_schema(item, "output")
    required = sum(1 for i in view.inputs if not i.get("optional"))
    req_name, resp_name = f"{safe(name)}.InferRequest", f"{safe(name)}.InferResponse"
    schemas[req_name] = {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"}, "parameters": oa.ref("Parameters"),
        "inputs": {"type": "array", "minItems": required, "maxItems": len(ins),
                   "items": {"oneOf": [oa.ref(k) for k in ins]} if ins else {}},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "enum": [o["name"] for o in view.outputs]},
            "parameters": oa.ref("Parameters")}}}}}
    examples = [e for e in (example_input(i) for i in view.inputs) if e is not None]
    if examples and len(examples) == len(view.inputs):
        schemas[req_name]["example"] = {"inputs": examples}
    schemas[resp_name] = {"type": "object", "required": ["model_name", "outputs"], "properties": {
        "model_name": {"type": "string", "enum": [name]}, "model_version": {"type": "string"},
        "id": {"type": "string"}, "parameters": oa.ref("Parameters"),
        "outputs": {"type": "array", "items": {"oneOf": [oa.ref(k) for k in outs]} if outs else {}}}}
    infer = oa.infer_operation(req_name, resp_name, f"Infer with {name}")
    version = oa.path_param("model_version", tuple(versions), "a version of this model")
    paths = oa.model_paths(f"/v2/models/{name}", [], infer)
    paths.update(oa.model_paths(f"/v2/models/{name}/versions/{{model_version}}", [version], infer))
    for item in paths.values():  # no empty parameters lists: the model's name is in the path itself
        if not item["parameters"]:
            del item["parameters"]
    described = view.description or f"The model {name}."
    doc = {"openapi": oa.VERSION,
           "info": {"title": f"aieng model {name}", "version": view.version,
                    "description": f"{described}\n\nVersions: {', '.join(versions)} (default {view.version})."
                                   f" Inputs: {', '.join(i['name'] for i in view.inputs) or 'none'}."},
           "x-aieng-model": {"name": name, "version": view.version, "versions": list(versions),
                             "description": view.description, "metadata": view.metadata,
                             "max_batch_size": view.max_batch_size if view.batched else 0},
           "tags": [{"name": t} for t in ("inference", "model", "statistics")],
           "paths": paths, "components": {"schemas": schemas}}
    return oa.secure(doc, keys)
