"""Triton's ``config.pbtxt``, read into Triton's own ``ModelConfig`` message and checked field by field.

``read(path)`` parses the file with protobuf's text format into ``model_config_pb2.ModelConfig`` (a malformed
file is one ``ModelError`` naming the file, the line and the column); ``from_json(text, where)`` does the same
for the JSON form a repository ``load`` carries (protobuf's json_format).  ``check(msg, where)`` applies the
field policy and returns a frozen ``TritonConfig``:

- honoured: ``name``, ``platform: onnxruntime_onnx`` / ``backend: onnxruntime``, ``max_batch_size``,
  ``input``/``output`` (name, data_type, dims, optional, ``reshape``: the graph's shape for ``dims``),
  ``dynamic_batching.max_queue_delay_microseconds`` (the batching wait), ``version_policy``,
  ``default_model_filename``, ``model_warmup`` (checked: names, types, dims, its files), ``parameters`` (kept,
  shown);
- ``REFUSED``: a field that would change answers and that aieng cannot honour fails the model's load naming
  the field (and any other platform or backend, named);
- ``TUNING``: a field that only tunes performance and does not apply here: kept in ``notes``, which the scan
  logs once per model.

The graph-dependent part (auto-complete from the ONNX graph, checks against it, the ``ModelSpec``) is
``models/triton_spec.py``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, text_format

from aieng.models import yaml_file
from aieng.models.proto import model_config_pb2 as mc
from aieng.models.sections import WarmupInput, WarmupSample
from aieng.models.spec import ModelError

CONFIG_FILE = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20  # Triton's configs are a few KiB; the same bound as a model.yaml
ONNX_PLATFORM, ONNX_BACKEND = "onnxruntime_onnx", "onnxruntime"
OTHER_PLATFORMS = {  # Triton's names, for a refusal that says what the model is
    "tensorrt_plan": "TensorRT", "tensorflow_graphdef": "TensorFlow", "tensorflow_savedmodel": "TensorFlow",
    "pytorch_libtorch": "PyTorch", "ensemble": "an ensemble", "python": "Python", "pytorch": "PyTorch",
    "tensorflow": "TensorFlow", "tensorrt": "TensorRT", "openvino": "OpenVINO", "fil": "FIL", "dali": "DALI",
    "vllm": "vLLM", "tensorrtllm": "TensorRT-LLM", "onnxruntime_genai": "ONNX Runtime GenAI"}

# Fields aieng cannot honour and that change what a client gets: the load fails naming the field.
REFUSED = {
    "sequence_batching": "stateful sequence batching (aieng has no sequence state)",
    "ensemble_scheduling": "ensemble scheduling (an ensemble is not served)",
    "batch_input": "batch inputs (tensors Triton makes from the batch)",
    "batch_output": "batch outputs (outputs Triton scatters by input shape)",
    "model_operations": "custom operation libraries (aieng loads no op library)",
    "model_repository_agents": "repository agents (they change the model's files before loading)",
    "runtime": "a custom backend runtime",
    "dynamic_batching.default_queue_policy": "a queue policy (time-outs and rejections Triton would answer)",
    "dynamic_batching.priority_queue_policy": "per-priority queue policies",
}
# Fields that only tune performance and do not apply here: logged once per model.
TUNING = {
    "optimization": "ONNX Runtime runs with aieng's own settings (graph optimisation all, its threads)",
    "dynamic_batching.preferred_batch_size": "aieng's batcher sizes batches by their measured cost",
    "dynamic_batching.preserve_ordering": "every request gets its own answer",
    "dynamic_batching.priority_levels": "requests are served in arrival order",
    "dynamic_batching.default_priority_level": "requests are served in arrival order",
    "instance_group.count": "the executor's lanes are server-wide (AIENG_EXECUTOR_LANES)",
    "instance_group.gpus": "the device is server-wide (AIENG_DEVICE)",
    "instance_group.kind": "the device is server-wide (AIENG_DEVICE): the model runs on the CPU where no "
                           "GPU is usable",
    "instance_group.rate_limiter": "no rate limiter",
    "instance_group.secondary_devices": "the device is server-wide",
    "instance_group.profile": "TensorRT profiles do not apply",
    "instance_group.passive": "every version loaded serves",
    "instance_group.host_policy": "no host policies",
    "cc_model_filenames": "one model file per version",
    "metric_tags": "aieng's metrics carry the model and version",
    "model_metrics": "aieng's own metrics and buckets",
    "response_cache": "aieng's response cache is server-wide (AIENG_CACHE_*)",
    "model_transaction_policy": "one response per request",
    "input.format": "informational for ONNX models",
    "output.label_filename": "the classification extension is not served",
}
DATATYPES = {  # ModelConfig's DataType -> the OIP datatype
    **{f"TYPE_{t}": t for t in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                "INT64", "FP16", "FP32", "FP64", "BF16")}, "TYPE_STRING": "BYTES"}


@dataclass(frozen=True)
class TensorConfig:
    """One ``input`` or ``output`` as written: ``dims`` without the batch axis when the model batches."""
    name: str
    datatype: str  # the OIP datatype ("INT32", "BYTES")
    dims: tuple[int, ...]  # -1: any size
    optional: bool = False
    field: str = ""  # "input[0]": where it was written, for messages
    reshape: tuple[int, ...] | None = None  # the model's own shape for ``dims`` (None: the same)


@dataclass(frozen=True)
class TritonConfig:
    path: str  # config.pbtxt (or where an override came from)
    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    dynamic_batching: bool
    max_queue_delay_us: int
    version_policy: Any  # aieng's form (settings.apply_policy): "all", {"latest": N} or [v, ...]
    default_model_filename: str
    warmup: tuple[WarmupSample, ...]
    parameters: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]  # performance-only fields not applied here: "<field>: <why>", logged once


def read(path: str) -> mc.ModelConfig:
    """``path`` parsed into a ``ModelConfig``; a malformed file is one ``ModelError`` naming file:line:col."""
    data = yaml_file.read_bytes(path, MAX_CONFIG_BYTES)  # a regular file, bounded, never blocking
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: not UTF-8: {exc}") from None
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        reason = str(exc).split(" : ", 1)[-1] if line else str(exc)
        where = f"{path}:{line}:{col}" if line else path
        raise ModelError(f"{where}: malformed config.pbtxt: {reason}") from None


def from_json(raw: str | bytes | dict, where: str) -> mc.ModelConfig:
    """A ``ModelConfig`` in protobuf's JSON form (a repository load's ``config`` parameter)."""
    try:
        if isinstance(raw, dict):
            return json_format.ParseDict(raw, mc.ModelConfig())
        return json_format.Parse(raw, mc.ModelConfig())
    except json_format.ParseError as exc:
        raise ModelError(f"{where}: the config is not a ModelConfig: {exc}") from None


def to_dict(msg: mc.ModelConfig) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _set(msg: Any, prefix: str = "") -> list[str]:
    """The dotted names of the fields ``msg`` sets to other than their defaults."""
    return [prefix + fd.name for fd, _ in msg.ListFields()]


def _policy_fields(msg: mc.ModelConfig, where: str) -> list[str]:
    """Refuse what cannot be honoured; return the notes for what only tunes performance."""
    seen = _set(msg)
    if msg.HasField("dynamic_batching"):
        seen += _set(msg.dynamic_batching, "dynamic_batching.")
    for group in msg.instance_group:
        seen += _set(group, "instance_group.")
    for i in msg.input:
        seen += _set(i, "input.")
    for o in msg.output:
        seen += _set(o, "output.")
    for name in seen:
        if name in REFUSED:
            raise ModelError(f"{where}: {name}: {REFUSED[name]} cannot be honoured by aieng: refused")
    if msg.model_transaction_policy.decoupled:
        raise ModelError(f"{where}: model_transaction_policy.decoupled: aieng answers each request once: "
                         "refused")
    for i in msg.input:
        if i.is_shape_tensor or i.allow_ragged_batch or i.is_non_linear_format_io:
            what = ("is_shape_tensor" if i.is_shape_tensor else "allow_ragged_batch" if i.allow_ragged_batch
                    else "is_non_linear_format_io")
            raise ModelError(f"{where}: input '{i.name}': {what} cannot be honoured by aieng: refused")
    for o in msg.output:
        if o.is_shape_tensor or o.is_non_linear_format_io:
            raise ModelError(f"{where}: output '{o.name}': is_shape_tensor/is_non_linear_format_io cannot be "
                             "honoured by aieng: refused")
    notes = []
    for name in dict.fromkeys(seen):  # once per field, in the order written
        if name in TUNING and not (name == "instance_group.kind" and _cpu_only(msg)):
            notes.append(f"{name}: {TUNING[name]}")
    return notes


def _cpu_only(msg: mc.ModelConfig) -> bool:
    kinds = {g.kind for g in msg.instance_group}
    return kinds <= {mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_AUTO}


def _platform(msg: mc.ModelConfig, where: str) -> None:
    platform, backend = msg.platform, msg.backend
    for value, field in ((platform, "platform"), (backend, "backend")):
        if value and value not in (ONNX_PLATFORM, ONNX_BACKEND):
            what = OTHER_PLATFORMS.get(value, "not ONNX Runtime")
            raise ModelError(f"{where}: {field} '{value}' ({what}): aieng serves ONNX models only "
                             f"({field}: {ONNX_PLATFORM if field == 'platform' else ONNX_BACKEND}): refused")
    if platform == ONNX_BACKEND or backend == ONNX_PLATFORM:
        raise ModelError(f"{where}: platform is '{ONNX_PLATFORM}', backend is '{ONNX_BACKEND}': refused")


def _tensor(t: Any, field: str, where: str) -> TensorConfig:
    if not t.name:
        raise ModelError(f"{where}: {field}.name is required")
    datatype = DATATYPES.get(mc.DataType.Name(t.data_type)) if t.data_type else None
    if t.data_type and datatype is None:
        raise ModelError(f"{where}: {field}.data_type {mc.DataType.Name(t.data_type)} is not served")
    dims = tuple(int(d) for d in t.dims)
    if any(d < -1 or d == 0 for d in dims):
        raise ModelError(f"{where}: {field}.dims {list(dims)}: each must be -1 or a positive size")
    reshape = _reshape(tuple(int(d) for d in t.reshape.shape), dims, f"{where}: {field}.reshape") \
        if t.HasField("reshape") else None
    return TensorConfig(t.name, datatype or "", dims, bool(getattr(t, "optional", False)), field, reshape)


def _reshape(shape: tuple[int, ...], dims: tuple[int, ...], where: str) -> tuple[int, ...] | None:
    """A ``reshape`` that the tensors can take both ways (None where it changes nothing): the same number
    of elements, and a variable size only where ``dims`` has one, once on each side (numpy infers it)."""
    if shape == dims:
        return None
    if any(d < -1 for d in shape) or shape.count(-1) > 1 or dims.count(-1) > 1 or \
            (-1 in shape) != (-1 in dims):
        raise ModelError(f"{where} {list(shape)} cannot take dims {list(dims)}: at most one -1 on each "
                         "side, on both or neither")
    if -1 not in dims and _elements(shape) != _elements(dims):
        raise ModelError(f"{where} {list(shape)} holds {_elements(shape)} elements, dims {list(dims)} "
                         f"{_elements(dims)}")
    return shape


def _elements(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _version_policy(msg: mc.ModelConfig, where: str) -> Any:
    if not msg.HasField("version_policy"):
        return {"latest": 1}  # Triton's default: the highest version only
    which = msg.version_policy.WhichOneof("policy_choice")
    if which == "all":
        return "all"
    if which == "specific":
        versions = [str(v) for v in msg.version_policy.specific.versions]
        if not versions:
            raise ModelError(f"{where}: version_policy.specific names no versions")
        return versions
    n = msg.version_policy.latest.num_versions
    if n < 1:
        raise ModelError(f"{where}: version_policy.latest.num_versions must be >= 1")
    return {"latest": int(n)}


def _warmup(msg: mc.ModelConfig, where: str) -> tuple[WarmupSample, ...]:
    out = []
    for k, w in enumerate(msg.model_warmup):
        field = f"model_warmup[{k}]"
        sample = dict(w.inputs)  # a protobuf map: input name -> ModelWarmup.Input
        if not sample:
            raise ModelError(f"{where}: {field} has no inputs")
        inputs = []
        for name, spec in sorted(sample.items()):
            source = spec.WhichOneof("input_data_type")
            if source is None:
                raise ModelError(f"{where}: {field}.inputs['{name}'] needs zero_data, random_data or "
                                 "input_data_file")
            datatype = DATATYPES.get(mc.DataType.Name(spec.data_type))
            if datatype is None:
                raise ModelError(f"{where}: {field}.inputs['{name}'].data_type is required")
            inputs.append(WarmupInput(name, datatype, tuple(int(d) for d in spec.dims), source,
                                      spec.input_data_file))
        out.append(WarmupSample(w.name or field, int(w.batch_size), max(1, int(w.count)), tuple(inputs)))
    return tuple(out)


def check(msg: mc.ModelConfig, where: str, model: str) -> TritonConfig:
    """The field policy over ``msg`` (``where``: the file, for messages; ``model``: the directory's name)."""
    _platform(msg, where)
    if msg.name and msg.name != model:
        raise ModelError(f"{where}: name '{msg.name}' differs from the model directory's '{model}'")
    notes = _policy_fields(msg, where)
    if msg.max_batch_size < 0:
        raise ModelError(f"{where}: max_batch_size must be >= 0")
    for field, items in (("input", msg.input), ("output", msg.output)):
        names = [t.name for t in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ModelError(f"{where}: {field} '{dup[0]}' is declared twice")
    filename = msg.default_model_filename or "model.onnx"
    if os.sep in filename or filename.startswith("."):
        raise ModelError(f"{where}: default_model_filename must be a file name in the version directory")
    return TritonConfig(
        path=where, name=model, max_batch_size=int(msg.max_batch_size),
        inputs=tuple(_tensor(t, f"input[{k}]", where) for k, t in enumerate(msg.input)),
        outputs=tuple(_tensor(t, f"output[{k}]", where) for k, t in enumerate(msg.output)),
        dynamic_batching=msg.HasField("dynamic_batching"),
        max_queue_delay_us=int(msg.dynamic_batching.max_queue_delay_microseconds),
        version_policy=_version_policy(msg, where), default_model_filename=filename,
        warmup=_warmup(msg, where),
        parameters=tuple(sorted((k, v.string_value) for k, v in msg.parameters.items())),
        notes=tuple(notes))


def load(mdir: str, override: str | bytes | dict | None = None) -> TritonConfig:
    """``<mdir>/config.pbtxt`` checked (``override``: a ModelConfig in JSON form used instead, as Triton's
    repository load with a ``config`` parameter does)."""
    model = os.path.basename(os.path.normpath(mdir))
    if override is not None:
        where = f"{mdir} (the load's config override)"
        return check(from_json(override, where), where, model)
    path = os.path.join(mdir, CONFIG_FILE)
    return check(read(path), path, model)
