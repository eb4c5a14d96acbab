"""The sections of a ``ModelSpec`` (``models/spec.py``) as frozen records, read by attribute.

Each is built once, by the scan (``models/repo.py``, ``models/pipelines.py``, ``models/settings.py``) from a
model.yaml section already checked there, or by ``frozen.build`` from the wire.  Values the server does not
interpret stay as written, in an ``Opaque`` (``models/frozen.py``): what clients are shown of an input or
output declaration, a postprocess step's op parameters (the chain's ``parse`` checks them against the op's
declaration), a degradation fallback answer and the routing section's parts (the rollout parses those with
the parsers it uses for a reloaded model.yaml).  ``section()`` gives a section back in model.yaml's form
for the parser that owns it; no role reads it by key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from aieng.models.frozen import NO_VALUE as NO_MAP
from aieng.models.frozen import Opaque, build_fields, freeze, thaw
from aieng.models.image_config import ImagePreprocess


def _given(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record's fields that are set (not None), thawed, in declaration order."""
    return {f.name: thaw(v) for f in dataclasses.fields(obj)
            if f.name not in skip and (v := getattr(obj, f.name)) is not None}


# -- inputs and outputs -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class InputDecl:
    name: str
    kind: str  # text, image, number, category, tensor (models/repo.INPUT_KINDS)
    optional: bool = False
    shown: Opaque = NO_MAP  # the declaration as written: what the models op shows
    dtype: str | None = None  # a tensor input's, where declared (a graph or a config.pbtxt always does)
    shape: tuple[Any, ...] | None = None  # per request, as the client sends it; -1: any size
    reshape: tuple[int, ...] | None = None  # the graph's shape for ``shape`` (Triton's; None: as sent)

    @classmethod
    def parse(cls, raw: dict) -> "InputDecl":
        return cls(raw["name"], raw["kind"], bool(raw.get("optional", False)), Opaque.of(raw),
                   raw.get("dtype"), freeze(raw.get("shape")), freeze(raw.get("reshape")))


@dataclass(frozen=True, slots=True)
class OutputDecl:
    name: str
    kind: str  # tensor, str, number, list (models/repo.OUTPUT_KINDS); descriptive only
    dtype: str | None = None
    shape: tuple[Any, ...] | None = None
    shown: Opaque = NO_MAP  # the declaration as written, extra keys included: what the models op shows
    reshape: tuple[int, ...] | None = None  # the graph's shape for ``shape`` (Triton's; None: as run)

    @classmethod
    def parse(cls, raw: Any) -> "OutputDecl":
        """One declaration (a pipeline's outputs are not checked at scan: shown as written)."""
        get = raw.get if isinstance(raw, dict) else {}.get
        return cls(get("name", ""), get("kind", ""), get("dtype"), freeze(get("shape")), Opaque.of(raw),
                   freeze(get("reshape")))


# -- preprocess: one record per type ---------------------------------------------------------------------
# Values are kept as written: each processor converts and checks its own at its start, as before (a bad
# setting fails that model at the worker's start, docs/models.md), except the image section and a text
# section's ``tensors`` map, checked at scan.
@dataclass(frozen=True, slots=True)
class Preprocess:
    """A type without its own record: ``tensor``, a pipeline's ``pipeline``, or one no processor serves
    (the pool fails the model at its start)."""
    type: str = ""

    @staticmethod
    def parse(raw: dict) -> "Preprocess":
        """A ``preprocess`` section whose ``type`` is a string; ValueError from the image check."""
        kind = raw.get("type")
        if kind == "image":
            return ImagePreprocess.parse(raw)
        cls = PREPROCESS_TYPES.get(kind, Preprocess)
        return cls.from_section(raw)

    @classmethod
    def from_section(cls, raw: dict) -> "Preprocess":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: freeze(v) for k, v in raw.items() if k in names})

    @classmethod
    def from_wire(cls, data: dict) -> Any:
        return build_fields(PREPROCESS_TYPES.get(data.get("type"), Preprocess), data)

    def section(self) -> dict[str, Any]:
        return _given(self)


@dataclass(frozen=True)  # no slots: from_section calls super(), which a slotted copy of the class breaks
class TextPreprocess(Preprocess):
    type: str = "text"
    input: str = "text"
    tokenizer: str = "tokenizer.json"
    max_length: int = 512
    max_chars: int = 100_000
    ids: str = "input_ids"  # tensors.ids, tensors.mask, tensors.type_ids: the ONNX inputs fed
    mask: str | None = None
    type_ids: str | None = None

    TENSORS = ("ids", "mask", "type_ids")

    @classmethod
    def from_section(cls, raw: dict) -> "TextPreprocess":
        names = raw.get("tensors") or {}
        if not isinstance(names, dict):
            raise ValueError("preprocess.tensors must be a mapping (ids, mask, type_ids)")
        tensors = {k: names[k] for k in cls.TENSORS if k in names}
        rest = {k: v for k, v in raw.items() if k != "tensors" and k not in cls.TENSORS}  # those are tensors'
        return super().from_section({**rest, **tensors})

    def section(self) -> dict[str, Any]:
        out = _given(self, skip=self.TENSORS)
        out["tensors"] = {k: getattr(self, k) for k in self.TENSORS if getattr(self, k) is not None}
        return out


@dataclass(frozen=True, slots=True)
class TabularPreprocess(Preprocess):
    type: str = "tabular"
    state: str = "preprocess.json"
    tensor: str | None = None  # None: the state file's ``tensor``, else ``features``


@dataclass(frozen=True, slots=True)
class PythonPreprocess(Preprocess):
    """A team's own Python (``models/hooks.py``: ``entry`` checked at the scan, imported only in a pool)."""
    type: str = "python"
    entry: str = ""
    params: Opaque = NO_MAP  # the section's other keys, handed to the user's code whole (HookSpec.params)

    @classmethod
    def from_section(cls, raw: dict) -> "PythonPreprocess":
        return cls("python", raw.get("entry"),
                   Opaque.of({k: v for k, v in raw.items() if k not in ("type", "entry")}))

    def section(self) -> dict[str, Any]:
        return {"type": self.type, "entry": self.entry, **self.params.thaw()}


PREPROCESS_TYPES: dict[str, type] = {"text": TextPreprocess, "image": ImagePreprocess,
                                     "tabular": TabularPreprocess, "python": PythonPreprocess}


# -- postprocess: the chain's steps as declared ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepDecl:
    """One chain step as written; ``postprocess_workers.chain.parse`` checks it (at scan and at build)."""
    op: str
    name: str | None = None
    timeout_ms: float | None = None
    on_timeout: str | None = None
    isolate: str | None = None
    source: str | None = None  # the value the op reads (most ops take one)
    params: Opaque = NO_MAP  # the op's other parameters, checked against its declaration by the chain

    KEYS = ("name", "timeout_ms", "on_timeout", "isolate", "source")

    @classmethod
    def parse(cls, raw: dict) -> "StepDecl":
        return cls(raw["op"], *(raw.get(k) for k in cls.KEYS),
                   Opaque.of({k: v for k, v in raw.items() if k != "op" and k not in cls.KEYS}))

    def section(self) -> dict[str, Any]:
        return {"op": self.op, **_given(self, skip=("op", "params")), **self.params.thaw()}


@dataclass(frozen=True, slots=True)
class Postprocess:
    steps: tuple[StepDecl, ...] = ()
    answer: tuple[str, ...] | None = None
    type: str | None = None  # the op of the single-op form (``postprocess: {type: OP, ...}``); None: a chain

    @classmethod
    def parse(cls, raw: Any) -> "Postprocess":
        """A section the chain's ``parse`` accepts (a pipeline's: none, no steps)."""
        if isinstance(raw, dict) and "type" in raw:
            step = StepDecl.parse({"op": raw["type"], **{k: v for k, v in raw.items() if k != "type"}})
            return cls((step,), None, raw["type"])
        if isinstance(raw, dict):
            answer = raw.get("answer")
            return cls(tuple(StepDecl.parse(s) for s in raw.get("steps") or ()),
                       None if answer is None else tuple(answer))
        return cls(tuple(StepDecl.parse(s) for s in raw or ()))

    @property
    def user_code(self) -> bool:
        """A step runs a team's own Python (``op: python``): only a pool may run it, with the request."""
        return any(s.op == "python" for s in self.steps)

    def section(self) -> dict[str, Any] | list:
        """model.yaml's form, for ``chain.parse``."""
        if self.type is not None:
            step = self.steps[0].section()
            return {"type": step.pop("op"), **step}
        out: dict[str, Any] = {"steps": [s.section() for s in self.steps]}
        if self.answer is not None:
            out["answer"] = list(self.answer)
        return out


# -- batching, padding, drift, degradation -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Batching:
    max_batch_size: int = 8
    max_wait_ms: float = 2.0
    max_padding_waste: float = 0.3
    # False: the graph has no batch axis to stack along (a fixed first axis, or none: Triton's
    # max_batch_size 0); each request carries whole shapes and runs alone (max_batch_size is then 1).
    # The executor also finds this from the session's own input shapes, whatever the spec says.
    batched: bool = True
    # True: requests batch only with requests whose tensors have the same shapes (no padding: a model
    # inferred from its graph says nowhere that padding is safe); False: padded along variable axes.
    exact_shapes: bool = False


@dataclass(frozen=True, slots=True)
class Padding:
    """ONNX input name -> the value that pads it along its variable axes (0 when not named)."""
    values: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, raw: dict | None) -> "Padding":
        return cls(tuple((raw or {}).items()))

    def pad_value(self, name: str) -> float:
        for key, value in self.values:
            if key == name:
                return value
        return 0


@dataclass(frozen=True, slots=True)
class Drift:
    reference: str | None = None  # a reference population file in the version directory


@dataclass(frozen=True, slots=True)
class Degrade:
    """``degrade:`` as written; the frontend's ``Degrader`` converts it at its start."""
    queue_depth: tuple[float, ...] | None = None
    latency_ms: tuple[float, ...] | None = None
    fallback: Opaque | None = None  # the outputs answered at level 3: handed to clients whole

    @classmethod
    def parse(cls, raw: dict | None) -> "Degrade | None":
        if not raw:
            return None
        fallback = raw.get("fallback")
        return cls(freeze(raw.get("queue_depth")), freeze(raw.get("latency_ms")),
                   None if fallback is None else Opaque.of(fallback))


# -- what a model described by its graph alone was inferred as (models/inferred.py) -------------------------
@dataclass(frozen=True, slots=True)
class InferredTensor:
    name: str
    datatype: str  # OIP
    dtype: str  # numpy's name, where numpy has one (else the OIP name, lower case: "bf16")
    graph_shape: tuple[Any, ...]  # as the graph gives it: an int, a symbol, or None per axis
    shape: tuple[int, ...]  # per request (the batch axis left out when batched); -1: any size


@dataclass(frozen=True, slots=True)
class Inferred:
    """What was inferred from the graph, and why (shown by ``aieng models``, the models op, OIP config)."""
    onnx_file: str
    inputs: tuple[InferredTensor, ...]
    outputs: tuple[InferredTensor, ...]
    batched: bool
    batching_why: str  # the batch-axis rule's verdict, naming the tensor that decided it
    max_batch_size: int
    cap_why: str  # how the cap was chosen
    measured: tuple[tuple[int, float], ...] = ()  # (rows, microseconds per row) of the cap's runs

    def public(self) -> dict[str, Any]:
        return {"from": "onnx graph", "onnx_file": self.onnx_file, "batched": self.batched,
                "batching_why": self.batching_why, "max_batch_size": self.max_batch_size,
                "cap_why": self.cap_why, "measured_us_per_row": {str(r): us for r, us in self.measured},
                "inputs": [_public(t) for t in self.inputs], "outputs": [_public(t) for t in self.outputs]}


def _public(t: InferredTensor) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "dtype": t.dtype, "graph_shape": list(t.graph_shape),
            "shape": list(t.shape)}


# -- model-wide: routing, pool -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Routing:
    """The model-wide ``routing`` section, checked at scan (``settings.check_routing``).  The rollout
    builds its state from ``section()`` with the parsers it applies to a reloaded model.yaml, and keys a
    saved routing by that map's digest, so the section travels exactly as written: ``given`` names the
    keys it had, in order."""
    weights: Opaque | None = None
    rules: Opaque | None = None
    groups: Opaque | None = None
    allow_pinned: bool | None = None
    auto_rollback: Opaque | None = None
    shadow: Opaque | None = None
    given: tuple[str, ...] = ()

    KEYS = ("weights", "rules", "groups", "allow_pinned", "auto_rollback", "shadow")

    @classmethod
    def parse(cls, raw: dict | None) -> "Routing | None":
        if raw is None:
            return None
        return cls(**{k: raw[k] if k == "allow_pinned" or raw[k] is None else Opaque.of(raw[k])
                      for k in cls.KEYS if k in raw}, given=tuple(raw))

    def section(self) -> dict[str, Any]:
        return {k: v.thaw() if isinstance(v := getattr(self, k), Opaque) else v for k in self.given}


@dataclass(frozen=True, slots=True)
class PoolSetting:
    """The model-wide ``pool`` section (``settings.parse_setting``): lazy loading and eviction."""
    lazy: bool = False
    pinned: bool = False

    @property
    def evictable(self) -> bool:
        return self.lazy and not self.pinned


# -- pipelines -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PipelineStep:
    """One checked step (``pipelines.check_pipeline``); only its step's keys are set."""
    step: str
    model: str | None = None  # textdet, textrec
    max_crops: int | None = None  # crop
    rotate_ratio: float | None = None
    min_score: float | None = None  # join

    def public(self) -> dict[str, Any]:
        return _given(self)


@dataclass(frozen=True, slots=True)
class Pipeline:
    steps: tuple[PipelineStep, ...]

    @classmethod
    def parse(cls, steps: list[dict]) -> "Pipeline":
        return cls(tuple(PipelineStep(**s) for s in steps))

    def public(self) -> list[dict[str, Any]]:
        return [s.public() for s in self.steps]


# -- warm-up samples (Triton's ``model_warmup``, models/triton_config.py) -----------------------------------
@dataclass(frozen=True, slots=True)
class WarmupInput:
    name: str
    datatype: str  # the OIP datatype
    dims: tuple[int, ...]  # one row's (the sample's batch_size rows are stacked when the model batches)
    source: str  # zero_data, random_data or input_data_file
    data_file: str = ""  # input_data_file: under <model>/warmup/


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """Run ``count`` times before the version is ready (the executor's ``warm_samples``)."""
    name: str
    batch_size: int
    count: int
    inputs: tuple[WarmupInput, ...]
