"""A Triton model version as a ``ModelSpec``: a checked ``TritonConfig`` (``models/triton_config.py``) and
the version's ONNX graph (``models/onnx_infer.py``), as a tensor model.

``triton_spec(name, version, path, cfg, graph)``:

- auto-complete, as Triton's ONNX Runtime backend does: a config without inputs (outputs) takes the graph's;
  ``max_batch_size`` 0 with neither inputs nor outputs given, on a graph whose every input and output has an
  open first axis, batches, at the cap measured on the graph (``models/measure.py``; Triton guesses 4);
- checks against the graph, each failing the load naming the field: a declared input or output the graph
  lacks, a graph input left undeclared, a ``data_type`` or ``dims`` (``reshape`` where given: rank, or a
  size the graph fixes otherwise) that contradicts it, ``max_batch_size`` > 0 on a graph whose first axis
  is fixed, a warm-up sample that does not fit the inputs;
- the spec: inputs and outputs ``kind: tensor`` with their dtype and dims (without the batch axis when the
  model batches) and ``reshape`` (the tensor processor and op reshape each request's tensors between the
  two), ``preprocess``/``postprocess`` ``tensor``; ``max_batch_size`` 0 serves whole shapes, one
  request per run (``Batching.batched`` false); requests batch only with requests of the same shapes (no
  padding: Triton batches no ragged inputs); ``dynamic_batching``'s delay is the batching wait (without
  ``dynamic_batching``: no waiting to fill a batch; requests already queued still run together, which
  changes no answer); the ONNX file is ``default_model_filename``.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from aieng.models.frozen import Opaque
from aieng.models.measure import measure_cap
from aieng.models.onnx_infer import ELEMENT_TYPES
from aieng.models.sections import Batching, InputDecl, OutputDecl, Padding, Postprocess, Preprocess
from aieng.models.spec import ModelError, ModelSpec, content_hash, resolve_inside, version_dir
from aieng.models.triton_config import TensorConfig, TritonConfig

# OIP datatype -> numpy dtype name, from the graph reader's one table (BF16: named, so that the executor's
# load refuses it naming the type; numpy has none)
NUMPY = {oip: np for _, oip, np in ELEMENT_TYPES.values() if oip and np} | {"BF16": "bfloat16"}
ITEM_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4,
              "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}
WARMUP_DIR = "warmup"  # Triton reads a sample's input_data_file from <model>/warmup/


def _graph_dims(t: Any) -> tuple[int, ...] | None:
    """A graph tensor's shape with -1 for each open axis (None: the graph gives no rank)."""
    return None if t.shape is None else tuple(-1 if d is None else int(d) for d in t.shape)


def _complete(declared: tuple[TensorConfig, ...], graph_side: tuple, side: str, batched: bool,
              where: str) -> tuple[TensorConfig, ...]:
    """The declared tensors checked against the graph's, or the graph's own when none is declared."""
    by_name = {t.name: t for t in graph_side}
    if not declared:
        out = []
        for k, t in enumerate(graph_side):
            dims = _graph_dims(t)
            if t.datatype is None or dims is None:
                raise ModelError(f"{where}: the graph's {side} '{t.name}' ({t.onnx_type or t.kind}, "
                                 f"{t.describe_dims()}) cannot be auto-completed: declare it")
            if batched and (not dims or dims[0] != -1):
                raise ModelError(f"{where}: max_batch_size > 0, but the graph's {side} '{t.name}' has no "
                                 f"open first axis ({t.describe_dims()}): set max_batch_size 0")
            out.append(TensorConfig(t.name, t.datatype, dims[1:] if batched else dims, False, f"{side}[{k}]"))
        return tuple(out)
    for d in declared:
        g = by_name.get(d.name)
        if g is None:
            raise ModelError(f"{where}: {d.field}.name '{d.name}' is not an {side} of the graph "
                             f"(its {side}s: {', '.join(by_name) or 'none'})")
        if not d.datatype:
            raise ModelError(f"{where}: {d.field}.data_type is required")
        if g.datatype != d.datatype:
            written = "TYPE_" + ("STRING" if d.datatype == "BYTES" else d.datatype)
            raise ModelError(f"{where}: {d.field}.data_type {written} contradicts the graph's {side} "
                             f"'{d.name}' ({g.onnx_type or g.kind})")
        gdims = _graph_dims(g)
        if gdims is None:
            continue  # the graph does not say: the declaration stands
        if batched:
            if not gdims or gdims[0] != -1:
                raise ModelError(f"{where}: max_batch_size > 0, but the graph's {side} '{d.name}' has no "
                                 f"open first axis ({g.describe_dims()}): set max_batch_size 0")
            gdims = gdims[1:]
        own, what = (d.dims, "dims") if d.reshape is None else (d.reshape, "reshape.shape")
        if len(gdims) != len(own) or any(a != b and -1 not in (a, b) for a, b in zip(gdims, own)):
            lead = "batch, " if batched else ""
            raise ModelError(f"{where}: {d.field}.{what} {list(own)} contradict the graph's {side} "
                             f"'{d.name}' {g.describe_dims()} (dims are [{lead}...] "
                             f"{'without the batch axis' if batched else 'whole shapes'})")
    return declared


def _check_warmup(cfg: TritonConfig, inputs: tuple[TensorConfig, ...], mdir: str) -> None:
    by_name = {t.name: t for t in inputs}
    for sample in cfg.warmup:
        field = f"model_warmup '{sample.name}'"
        absent = [t.name for t in inputs if not t.optional and t.name not in {w.name for w in sample.inputs}]
        if absent:
            raise ModelError(f"{cfg.path}: {field} gives no input '{absent[0]}' (every required input)")
        if cfg.max_batch_size and sample.batch_size > cfg.max_batch_size:
            raise ModelError(f"{cfg.path}: {field}: batch_size {sample.batch_size} > max_batch_size "
                             f"{cfg.max_batch_size}")
        for w in sample.inputs:
            t = by_name.get(w.name)
            if t is None:
                raise ModelError(f"{cfg.path}: {field}: '{w.name}' is not an input of the model")
            if w.datatype != t.datatype or len(w.dims) != len(t.dims) or any(
                    a != b and b != -1 for a, b in zip(w.dims, t.dims)) or -1 in w.dims:
                raise ModelError(f"{cfg.path}: {field}: input '{w.name}' ({w.datatype} {list(w.dims)}) does "
                                 f"not fit the input ({t.datatype} {list(t.dims)})")
            if w.source == "input_data_file":
                full = resolve_inside(os.path.join(mdir, WARMUP_DIR), w.data_file)
                if not os.path.isfile(full):
                    raise ModelError(f"{cfg.path}: {field}: input_data_file {WARMUP_DIR}/{w.data_file} is "
                                     "missing")
                want = ITEM_BYTES.get(w.datatype, 0) * _count(w.dims)
                if want and os.path.getsize(full) != want:
                    raise ModelError(f"{cfg.path}: {field}: {WARMUP_DIR}/{w.data_file} holds "
                                     f"{os.path.getsize(full)} bytes, {want} expected")


def _decl(t: TensorConfig) -> dict[str, Any]:
    reshape = {} if t.reshape is None else {"reshape": list(t.reshape)}
    return {"name": t.name, "kind": "tensor", "dtype": NUMPY[t.datatype], "datatype": t.datatype,
            "shape": list(t.dims), **reshape}


def _count(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def batching_of(cfg: TritonConfig, batched: bool, cap: int) -> Batching:
    """Requests batch only with requests of the same shapes (Triton batches no ragged inputs unless told);
    ``batched`` False: whole shapes, one request per run (Triton's max_batch_size 0)."""
    wait_ms = cfg.max_queue_delay_us / 1000.0 if cfg.dynamic_batching else 0.0
    if not 0.0 <= wait_ms <= 10_000.0:
        raise ModelError(f"{cfg.path}: dynamic_batching.max_queue_delay_microseconds is over 10 s")
    return Batching(max_batch_size=cap if batched else 1, max_wait_ms=wait_ms, max_padding_waste=0.0,
                    batched=batched, exact_shapes=True)


def triton_spec(name: str, version: str, path: str, cfg: TritonConfig, graph: Any) -> ModelSpec:
    """Version ``version`` (directory ``path``) of the model ``cfg`` describes, against its ``graph``
    (``onnx_infer.GraphInfo``)."""
    where = cfg.path
    auto = cfg.max_batch_size == 0 and not cfg.inputs and not cfg.outputs
    batched = cfg.max_batch_size > 0 or (auto and graph.batch_axis().batched)
    cap = cfg.max_batch_size
    if batched and not cap:  # auto-complete: the cap measured on the graph, not Triton's guess of 4
        cap = measure_cap(graph.path, graph).max_batch_size
    inputs = _complete(cfg.inputs, graph.inputs, "input", batched, where)
    outputs = _complete(cfg.outputs, graph.outputs, "output", batched, where)
    missing = [t.name for t in graph.inputs if t.name not in {i.name for i in inputs}]
    if missing:
        raise ModelError(f"{where}: the graph's input '{missing[0]}' is not declared (declare every input, "
                         "or none to take the graph's)")
    _check_warmup(cfg, inputs, os.path.dirname(path.rstrip(os.sep)))
    onnx_path = resolve_inside(path, cfg.default_model_filename)
    desc = f"Triton config.pbtxt ({cfg.name})"
    if cfg.parameters:
        desc += "; parameters " + ", ".join(f"{k}={v}" for k, v in cfg.parameters)
    return ModelSpec(
        name=name, version=version, path=version_dir(path), content_hash=content_hash(path),
        description=desc,
        inputs=tuple(InputDecl.parse({**_decl(t), **({"optional": True} if t.optional else {})})
                     for t in inputs),
        outputs=tuple(OutputDecl.parse(_decl(t)) for t in outputs),
        preprocess=Preprocess.parse({"type": "tensor"}), postprocess=Postprocess.parse({"type": "tensor"}),
        padding=Padding(), batching=batching_of(cfg, batched, cap), timeout_ms=0, onnx_path=onnx_path,
        metadata=Opaque.of({}), warmup=cfg.warmup, described_by="config.pbtxt")


def load_version(name: str, version: str, path: str, cfg: TritonConfig) -> ModelSpec:
    """The spec of one version of a config.pbtxt model: its graph read (``onnx_infer.describe``), then
    ``triton_spec``."""
    from aieng.models.onnx_infer import describe  # imports onnx: only a Triton model pays for it

    onnx_path = resolve_inside(path, cfg.default_model_filename)
    if not os.path.isfile(onnx_path):
        raise ModelError(f"{path}: {cfg.default_model_filename} is missing (config.pbtxt: "
                         f"default_model_filename)")
    try:
        graph = describe(onnx_path)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    return triton_spec(name, version, path, cfg, graph)


def log_notes(cfg: TritonConfig, log: logging.Logger) -> None:
    """Each performance-only field that does not apply here, once per model read."""
    for note in cfg.notes:
        log.warning("%s: %s (not applied: it tunes performance only)", cfg.path, note)
