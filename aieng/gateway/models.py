"""What the OIP metadata, config, stats and repository answers say, built from the frontend's replies.

The frontend's ``models`` op is the source of truth for which models and versions exist (the
gateway asks at start and every ``REFRESH_S``, so a change of models shows without a restart);
``stats`` gives the timings.  Each version becomes a ``ModelView``: its OIP inputs and outputs
(datatype and shape, batch first as ``-1``, variable dimensions ``-1``), the input kinds the codec
splits rows by, and ``max_batch_size`` (the most rows one OIP request may carry).  A model that does not
batch (``max_batch_size`` 1) is shown as Triton shows one: shapes without the batch dimension, config
``max_batch_size`` 0, one request per OIP request; so is one whose executor session reports it takes whole
shapes (``batched`` false: a graph without a batch axis).  A model inferred from its graph says what was
inferred and why in its config's ``parameters`` (``aieng.*``).  The answers are
plain dicts in the shapes Triton's HTTP API uses; the gRPC side parses the same dicts into its
messages, so both transports say the same thing.  An unknown model or version, and one that failed to
load, are refused in Triton's words (``unknown_model``, ``not_ready``), which its clients match.  A model
the start left out (its description did not load: listed with a ``load_error`` and no versions) is a
``ModelView`` with ``left_out`` set for any version asked, never ready, saying why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from aieng.gateway.codec import BY_DTYPE, DATATYPES
from aieng.models.sections import Batching

KIND_TYPE = {"text": "BYTES", "category": "BYTES", "image": "BYTES", "number": "FP32", "str": "BYTES",
             "list": "BYTES"}
CONFIG_TYPE = {"BYTES": "TYPE_STRING", **{k: "TYPE_" + k for k in ("BOOL", "UINT8", "UINT16", "UINT32",
               "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")}}
UNKNOWN = "Request for unknown model: "  # Triton's prefix, which its clients look for (e.g. startswith)
STAT_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
             "cache_miss")


@dataclass
class ModelView:
    name: str
    version: str
    max_batch_size: int
    max_wait_ms: float
    timeout_ms: int
    inputs: list[dict[str, Any]] = field(default_factory=list)  # {name, datatype, shape, kind, optional}
    outputs: list[dict[str, Any]] = field(default_factory=list)  # {name, datatype, shape}
    load_error: str | None = None
    # what was inferred from the graph and why (models/inferred.py), as config ``parameters``: built once, not
    # the models reply's whole ``inferred`` map kept per version (~5 KiB each in a hundred-model repository)
    parameters: dict[str, Any] = field(default_factory=dict)
    # Rows along a batch axis, shown and split by it.  None: a cap above 1 says so.  A model described by
    # its graph or a config.pbtxt whose session batches keeps the axis at a cap of 1 too, as Triton shows
    # max_batch_size 1: its clients send [1, ...] (Triton's simple_string), and the session takes rows.
    rows_axis: bool | None = None
    reshapes: dict[str, list[int]] = field(default_factory=dict)  # tensor name -> Triton's reshape (config)
    left_out: bool = False  # the start left the model out: no version, no inputs; only its load_error
    description: str = ""  # the spec's, and its ``metadata`` map, shown by the model's OpenAPI document
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 1 if self.rows_axis is None else self.rows_axis

    @cached_property  # every infer asks; ``build_view`` builds a view whole, and nothing changes it after
    def kinds(self) -> dict[str, str]:
        return {i["name"]: i["kind"] for i in self.inputs}

    @cached_property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]


def _dims(shape: list) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def _onnx_io(onnx: dict | None, side: str, name: str) -> dict | None:
    return next((t for t in (onnx or {}).get(side, []) if t.get("name") == name), None)


def _tensor_io(item: dict, onnx_item: dict | None, batched: bool = True) -> tuple[str, list[int]]:
    """``batched`` False: the executor's session takes whole shapes (the graph has no batch axis): shown
    as the session has them, whatever a model.yaml declares."""
    dtype, shape = item.get("dtype"), item.get("shape")
    if onnx_item is not None and (dtype is None or not batched):
        dtype = dtype or onnx_item.get("dtype")
        got = onnx_item.get("shape") or [None]
        shape = got[1:] if batched else got
    datatype = item.get("datatype")  # an inferred declaration names its OIP datatype
    if datatype not in DATATYPES:
        datatype = BY_DTYPE.get(dtype or "float32", "FP32")
    return datatype, [-1] + _dims(shape if shape is not None else [-1])


def build_view(name: str, pub: dict, batching: Batching | None) -> ModelView:
    onnx = pub.get("onnx")
    whole = (onnx or {}).get("batched") is False  # the executor runs it unbatched, whatever the spec says
    view = ModelView(name, pub["version"], 1 if whole else max(1, int(pub.get("max_batch_size") or 1)),
                     float(batching.max_wait_ms if batching else pub.get("max_wait_ms") or 0.0),
                     int(pub.get("timeout_ms") or 0), load_error=pub.get("load_error"),
                     parameters=_inferred_parameters(pub.get("inferred")),
                     rows_axis=True if pub.get("described_by") in ("graph", "config.pbtxt")
                     and (onnx or {}).get("batched") is True else None,
                     description=str(pub.get("description") or ""), metadata=dict(pub.get("metadata") or {}))
    lead = [-1] if view.batched else []
    view.reshapes = {i["name"]: list(i["reshape"]) for i in (*pub.get("inputs", []), *pub.get("outputs", []))
                     if isinstance(i, dict) and i.get("reshape") is not None}
    for item in pub.get("inputs", []):
        kind = item["kind"]
        if kind == "tensor":
            dt, shape = _tensor_io(item, _onnx_io(onnx, "inputs", item["name"]), not whole)
            shape = lead + shape[1:]
        else:
            dt, shape = KIND_TYPE[kind], (lead or [1])
        view.inputs.append({"name": item["name"], "datatype": dt, "shape": shape, "kind": kind,
                            "optional": bool(item.get("optional"))})
    for item in pub.get("outputs", []):
        kind = item["kind"]
        if kind == "tensor":
            dt, shape = _tensor_io(item, _onnx_io(onnx, "outputs", item["name"]), not whole)
            shape = lead + shape[1:]
        else:
            dt, shape = ("FP64" if kind == "number" else KIND_TYPE[kind]), (lead or [1])
        view.outputs.append({"name": item["name"], "datatype": dt, "shape": shape})
    return view


class Catalog:
    """Every served model version as a ``ModelView``, rebuilt from each ``models`` reply."""

    def __init__(self, batching: dict[str, Batching] | None = None):
        self.batching = batching or {}  # "name/version" -> the spec's batching, known from spawn
        self.views: dict[str, dict[str, ModelView]] = {}
        self.default: dict[str, str] = {}
        self.left_out: dict[str, str] = {}  # name -> why the start left it out
        self.loaded = False

    def update(self, models: dict) -> None:
        views, default, left_out = {}, {}, {}
        for name, entry in models.items():
            if not entry.get("versions") and entry.get("load_error"):
                left_out[name] = entry["load_error"]
                continue
            default[name] = entry.get("default_version")
            views[name] = {v: build_view(name, pub, self.batching.get(f"{name}/{v}"))
                           for v, pub in entry.get("versions", {}).items()}
        self.views, self.default, self.left_out, self.loaded = views, default, left_out, True

    def get(self, name: str, version: str | None) -> ModelView | None:
        why = self.left_out.get(name)
        if why is not None:
            return ModelView(name, version or "", 1, 0.0, 0, load_error=why, left_out=True)
        versions = self.views.get(name)
        if not versions:
            return None
        return versions.get(version or self.default.get(name) or "")


def unknown_model(name: str, version: str | None) -> str:
    """Triton's text for a model (version) it does not serve: its clients match the prefix."""
    return f"{UNKNOWN}'{name}'" + (f" version {version}" if version else "") + " is not found"


def not_ready(view: ModelView, version: str | None) -> str:
    """Triton's text for a model whose version failed to load (a version named: "is not at ready state";
    the default one: "has no available versions"), with our reason after it."""
    what = f"version {version} is not at ready state" if version else "has no available versions"
    return f"{UNKNOWN}'{view.name}' {what}: {view.load_error}"


def metadata(view: ModelView) -> dict:
    return {"name": view.name, "versions": [view.version], "platform": "onnxruntime_onnx",
            "inputs": [{k: i[k] for k in ("name", "datatype", "shape")} for i in view.inputs],
            "outputs": [dict(o) for o in view.outputs]}


def _config_io(item: dict, batched: bool, reshapes: dict, optional: bool | None = None) -> dict:
    dims = item["shape"][1:] if batched else item["shape"]
    out: dict[str, Any] = {"name": item["name"], "data_type": CONFIG_TYPE[item["datatype"]],
                           "dims": dims or [1]}
    if item["name"] in reshapes:  # the config's own: the graph's shape for these dims
        out["reshape"] = {"shape": reshapes[item["name"]]}
    elif not dims:  # one element per row: Triton's way is dims [1] reshaped to a scalar
        out["reshape"] = {"shape": []}
    if optional is not None:
        out["optional"] = optional
    return out


def config(view: ModelView) -> dict:
    return {"name": view.name, "platform": "onnxruntime_onnx", "backend": "onnxruntime",
            "version_policy": {"specific": {"versions": [int(view.version)]}} if view.version.isdigit()
            else {"latest": {"num_versions": 1}},
            "max_batch_size": view.max_batch_size if view.batched else 0,
            "input": [_config_io(i, view.batched, view.reshapes, i["optional"]) for i in view.inputs],
            "output": [_config_io(o, view.batched, view.reshapes) for o in view.outputs],
            "dynamic_batching": {"preferred_batch_size": [],
                                 "max_queue_delay_microseconds": int(view.max_wait_ms * 1000)},
            "instance_group": [{"name": view.name, "kind": "KIND_CPU", "count": 1}],
            "parameters": dict(view.parameters)}


def _inferred_parameters(inferred: dict | None) -> dict:
    """What was inferred and why, as Triton's config ``parameters`` (string values, both transports)."""
    if not inferred:
        return {}
    rows = ", ".join(f"{r}: {us}" for r, us in (inferred.get("measured_us_per_row") or {}).items())
    found = {"aieng.inferred_from": f"{inferred.get('from')} {inferred.get('onnx_file')}",
             "aieng.batching": str(inferred.get("batching_why")),
             "aieng.max_batch_size": str(inferred.get("cap_why")),
             **({"aieng.measured_us_per_row": rows} if rows else {})}
    return {k: {"string_value": v} for k, v in found.items()}


def _duration(count: int, ns: float) -> dict:
    return {"count": int(count), "ns": int(ns)}


def stats(catalog: Catalog, reply: dict, only: str | None, version: str | None) -> list[dict]:
    """Triton's ``model_stats`` entries (every field present) from the frontend's ``stats`` reply.

    The frontend keeps stage timings per model (a bounded window), so counts and durations cover that
    window; ``fail`` is each version's admitted requests answered with an error and their time from
    receipt to the error (counters since the start or the last stats reset).
    """
    out = []
    for name, versions in sorted(catalog.views.items()):
        if only is not None and name != only:
            continue
        s = reply.get("models", {}).get(name, {})
        n = int(s.get("requests", 0))
        st = s.get("stages_us", {})

        def ns(*stages: str) -> float:
            return sum(st.get(k, {}).get("mean", 0.0) for k in stages) * 1000.0 * n

        batches = {int(b): c for b, c in (s.get("batch_sizes") or {}).items()}
        execs = sum(c / b for b, c in batches.items() if b)  # rows in batches of b -> c/b runs
        failed = reply.get("failures", {}).get(name, {})
        for v, view in sorted(versions.items()):
            if version is not None and v != version:
                continue
            inf = {k: _duration(0, 0) for k in STAT_KEYS}
            fail = failed.get(v) or {}
            inf["fail"] = _duration(fail.get("count", 0), fail.get("ns", 0))
            if v == catalog.default.get(name):
                inf.update(success=_duration(n, ns("total")), compute_infer=_duration(n, ns("inference")),
                           queue=_duration(n, ns("frontend_in", "preprocess_queue", "handoff", "batch_wait")),
                           compute_input=_duration(n, ns("preprocess")),
                           compute_output=_duration(n, ns("postprocess_queue", "postprocess",
                                                          "frontend_out")),
                           cache_miss=_duration(n, 0))
            runs = [{"batch_size": b, **{k: _duration(c // b, 0) for k in ("compute_input", "compute_infer",
                                                                           "compute_output")}}
                    for b, c in sorted(batches.items()) if b]
            out.append({"name": name, "version": v, "last_inference": 0,
                        "inference_count": inf["success"]["count"],
                        "execution_count": int(round(execs)) if inf["success"]["count"] else 0,
                        "inference_stats": inf, "response_stats": {},
                        "batch_stats": runs if inf["success"]["count"] else [], "memory_usage": []})
    return out
