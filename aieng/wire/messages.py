"""Every message that crosses a process boundary inside aieng, declared once, and their codec.

The field names are the internal protocol.  Messages are msgpack maps with a ``t`` tag naming the
type; receivers route on it with a dispatch table.  Every field has a declared type: nested records
(``Ref``, ``Trail``, ``Geometry``, ``PostItem``, ``ProcessState``, ``Step``, a ``ModelSpec``) travel as lists
or maps and come back as their type (``decode``; how each is carried is worked out once per type by
``records.codecs`` and ``records.plan``).  Tensors never travel here: a ``Ref`` names a shared-memory
slot (``aieng.wire.shm``).  A ``Trail`` travels with each request and collects every stage's clock
readings (one CLOCK_MONOTONIC for all processes).  Unpack limits derive from the client protocol's
(``configure``): every internal message may carry client ``params``.  docs/architecture.md ("Message
flow") draws who sends what to whom.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import msgpack

from aieng.models.spec import ModelSpec
from aieng.wire.records import Geometry, Packed, PostItem, ProcessState, Ref, Step, Trail, codecs, plan  # noqa: F401


@dataclass(slots=True)
class Hello:
    """Worker -> FE once it is ready to take work, then once a second as its heartbeat."""
    T: ClassVar[str] = "hello"
    worker: str
    role: str
    pid: int
    failed: dict[str, str] = field(default_factory=dict)  # versions it could not build -> why
    ring: str = ""  # its shared-memory ring's segment (preprocess, executor)
    providers: dict[str, str] = field(default_factory=dict)  # executor: version -> its session's provider
    # executor: version -> what ``models`` shows of its session, packed until the models op reads it
    sessions: Packed = Packed()
    gpus: int = 0  # executor: the GPUs its ONNX Runtime sees
    # the executor's: model versions whose postprocessing it runs itself (route them post="executor")
    inline_post: list[str] = field(default_factory=list)
    # the executor's: versions it may also preprocess, for a small request while idle (inline_pre)
    inline_pre: list[str] = field(default_factory=list)
    # the executor's: of those, the versions it preprocesses at any load, not only while idle
    inline_pre_any: list[str] = field(default_factory=list)
    lanes: list[int] = field(default_factory=list)  # its pool lanes' [sent, fell back, received] (lanes)

    def __post_init__(self) -> None:
        if isinstance(self.sessions, dict):
            self.sessions = Packed.of(self.sessions)


@dataclass(slots=True)
class PreTask:
    T: ClassVar[str] = "pre"
    rid: int
    model: str
    version: str
    deadline: float  # CLOCK_MONOTONIC seconds, same clock in every process
    trace: str = ""  # the request's trace id, for log lines
    post: str = ""  # the postprocess worker the frontend chose for it
    upstream: int = 0  # requests of this model in preprocessing when it was sent: more may come
    degraded: int = 0  # the model's degradation level at admission (1+: skip optional steps)
    # a pipeline's crop request (frontend/fanout): the body is the page, ``crop`` the box to cut from
    # it (4 x [x, y], page pixels), ``page`` the parent's rid (the worker keeps the decoded page)
    crop: list | None = None
    page: int = 0
    # Internal verification traffic (a golden case of a version loaded beside serving; not of a cold load,
    # which a request waits for), set by the frontend alone: the executor runs it on its low-priority
    # background lane, so serving keeps the cores
    background: bool = False
    # Nothing else is in flight, nor was lately (the frontend's idle rule, set by it alone): the worker may
    # spread this request's preprocessing over every core it may use (OpenCV's threads for an image)
    alone: bool = False
    # ``post``'s epoch when the frontend sent this (its deaths seen, ``Workers.epoch``): the executor puts
    # only rows of one worker and epoch in one output slot (``PostBatch``), never shared across a death
    epoch: int = 0


@dataclass(slots=True)
class InferTask:
    """pre[i] -> executor: one request's input tensors, ready to batch."""
    T: ClassVar[str] = "infer"
    rid: int
    model: str
    version: str
    deadline: float
    ref: Optional[Ref]  # None only inside the executor: a request it preprocessed itself (inline_pre)
    seq_len: int  # batching key: longest variable dimension (0: fixed shapes)
    upstream: int
    post: str
    params: dict[str, Any]  # the client's params, as sent, for postprocessing
    degraded: int = 0
    trace: str = ""
    trail: Trail = field(default_factory=Trail)
    geometry: Optional[Geometry] = None  # image models: sizes for mapping boxes to the page
    background: bool = False  # PreTask.background, passed on
    alone: bool = False  # PreTask.alone, passed on: only such a request may run on the idle-time wide session
    # its small facts for input-drift monitoring (processing/pre/features: token count and
    # out-of-vocabulary share, image size, aspect and brightness; tabular features as given), for its Result
    features: dict[str, float] = field(default_factory=dict)
    # the client's request frame as it arrived, only for a version whose postprocess is user code (its
    # ``post(outputs, inputs)`` gets the request's inputs; ``processing/post/python_op``); else None
    request: Optional[bytes] = None
    epoch: int = 0  # PreTask.epoch, passed on


@dataclass(slots=True)
class Preprocessed:
    """pre[i] -> FE, once per group it forwarded: these requests' input slots are the executor's now."""
    T: ClassVar[str] = "preprocessed"
    rids: list[int]
    refs: list[Ref]  # each slot's place (``Ref.place``: no tensors), for the frontend to free


@dataclass(slots=True)
class PostTask:
    """executor -> post[j]: one request's outputs."""
    T: ClassVar[str] = "post"
    rid: int
    model: str
    version: str
    ref: Ref
    params: dict[str, Any]  # the client's params, as sent
    degraded: int = 0  # the model's degradation level at admission (1+: skip optional steps)
    trace: str = ""
    trail: Trail = field(default_factory=Trail)
    geometry: Optional[Geometry] = None  # from InferTask, as the preprocessing set it
    features: dict[str, float] = field(default_factory=dict)  # from InferTask, for the Result
    request: Optional[bytes] = None  # from InferTask: the request frame, for user code's post (else None)


@dataclass(slots=True)
class PostBatch:
    """executor -> post[j]: the outputs of a batch's requests routed to that worker, in one slot: row ``i``
    of each tensor at ``ref`` is ``items[i]``'s (sent where no output is cut back per request and the
    rows fit one slot; else a ``PostTask`` each).  The slot is the worker's until it has answered every
    row; the frontend frees it only if the worker dies (each row's ``Ref`` in ``Inferred`` is this one)."""
    T: ClassVar[str] = "postbatch"
    model: str
    version: str
    ref: Ref
    items: list[PostItem]  # each read by ``processing.post.answer`` as the ``PostTask`` it stands for


@dataclass(slots=True)
class Inferred:
    """executor -> FE once per batch: these requests' outputs, handed to their postprocess workers, are at
    ``refs``: ``refs[k]`` holds the next ``counts[k]`` of ``rids`` (a ``PostBatch``'s rows share one slot,
    sent once; a ``PostTask``'s slot counts 1).  ``each()`` pairs them."""
    T: ClassVar[str] = "inferred"
    rids: list[int]
    refs: list[Ref]  # each slot's place (``Ref.place``: no tensors), for the frontend to free
    counts: list[int]

    def each(self):
        """``(rid, ref)`` for every request."""
        return zip(self.rids, (ref for ref, n in zip(self.refs, self.counts) for _ in range(n)))


@dataclass(slots=True)
class Result:
    T: ClassVar[str] = "result"
    rid: int
    outputs: bytes  # a packed msgpack map: output name -> value
    trail: Trail = field(default_factory=Trail)
    confidence: float | None = None  # top class probability, for classifiers (a metric)
    # postprocess steps; skipped ones (a timeout with ``on_timeout: skip``, or an input a skipped step
    # should have made) are missing from the answer
    steps: list[Step] = field(default_factory=list)
    # the drift facts its preprocessing found (InferTask.features, passed on): they come with the answer,
    # so no notice that another process sends can arrive too late for them
    features: dict[str, float] = field(default_factory=dict)
    distance: float | None = None  # embeddings: cosine distance to the golden centroid (output drift)


@dataclass(slots=True)
class Failed:
    """Any stage failing one request.  ``ref`` is a slot the FE must free, if any."""
    T: ClassVar[str] = "failed"
    rid: int
    code: str
    message: str
    ref: Optional[Ref] = None
    steps: list[Step] = field(default_factory=list)  # from postprocessing: the steps run, the last "timeout"
    stage: str = ""  # the failing stage, where the sender runs several ("preprocess": the direct route)


@dataclass(slots=True)
class Bundle:
    """Several messages to one receiver as one: each item is an encoded message (``encode``), dispatched
    in order as if it came alone (``runtime/hub.dispatch``).  The executor sends a batch's tasks for one
    postprocess worker so, and that worker its answers to the frontend: one wake-up and one send per
    batch instead of one per request."""
    T: ClassVar[str] = "bundle"
    items: list[bytes]


@dataclass(slots=True)
class Soon:
    """A request for the receiver is on its way (a lone request on an idle server): it polls without
    sleeping until it comes, at most ``for_s``, so the hand-off does not wait for its idle CPU to wake."""
    T: ClassVar[str] = "soon"
    for_s: float
    key: str = ""  # the request's version, when the receiver may announce it on (the executor's)
    post: str = ""  # its postprocess worker: the executor announces it there if its run will be quick


# The executor's ``Failed`` message for a task whose input ring it could not open (its preprocess worker died,
# its segment is gone): the frontend skips it for a request on its second try (``frontend/requests/retries``)
PRE_WORKER_GONE = "preprocess worker went away before inference"


# -- supervisor <-> frontend control ------------------------------------------
@dataclass(slots=True)
class WorkerDown:
    T: ClassVar[str] = "worker_down"
    worker: str
    exitcode: int
    pid: int


@dataclass(slots=True)
class ServiceState:
    """Supervisor -> FE: readiness and process table for health output."""
    T: ClassVar[str] = "state"
    ready: bool
    processes: dict[str, ProcessState]  # by process name
    restarts: dict[str, int]  # by role, all its processes together


@dataclass(slots=True)
class Pulse:
    """FE -> supervisor twice a second: is the pipeline healthy, and how long has each
    worker been silent (seconds since its last heartbeat)."""
    T: ClassVar[str] = "pulse"
    healthy: bool
    silent: dict[str, float]  # worker -> seconds since its last heartbeat
    # preprocess workers silent past AIENG_PREPROCESS_BUDGET_MS holding a request: stuck on one, to replace
    stuck: list[str] = field(default_factory=list)


@dataclass(slots=True)
class LogLevel:
    """FE -> every worker and the supervisor: change the log level now (admin op)."""
    T: ClassVar[str] = "log_level"
    level: str


@dataclass(slots=True)
class Drain:
    T: ClassVar[str] = "drain"
    grace_s: float


@dataclass(slots=True)
class Drained:
    T: ClassVar[str] = "drained"
    answered: int


@dataclass(slots=True)
class Reload:
    """Supervisor -> FE on SIGHUP (systemd reload): re-read routing from model.yaml and saved state."""
    T: ClassVar[str] = "reload"


@dataclass(slots=True)
class Reloaded:
    """FE -> supervisor: the reload is done (``ok``), with what changed or why it failed."""
    T: ClassVar[str] = "reloaded"
    ok: bool
    message: str


# -- run-time load/unload of model versions (hotswap: frontend/versions/hotswap.py, worker_hotswap.py) ---
@dataclass(slots=True)
class LoadVersion:
    """FE -> every worker and the supervisor: build this version and report.  The supervisor only
    records it, so a restarted worker comes up with it."""
    T: ClassVar[str] = "load_version"
    spec: ModelSpec  # a map on the wire (``ModelSpec.to_dict``)
    # A request waits for it (the model pool's cold load): built at the worker's own priority and warmed
    # up unpaced; otherwise (a swap beside serving) at low priority (worker_hotswap.lower_priority).
    urgent: bool = False
    # FE -> supervisor once the load passed (built everywhere, golden set): the version is the server's.
    # Until then it is pending: a worker that dies meanwhile drops it (never rebuilt at that restart).
    ready: bool = False


@dataclass(slots=True)
class UnloadVersion:
    """FE -> every worker and the supervisor: release ``key`` ("model:version"); its requests are drained."""
    T: ClassVar[str] = "unload_version"
    key: str
    # An eviction by the model pool (a lazy version): the supervisor keeps it as cold, not gone, so a
    # restarted frontend still routes to it and a restarted worker does not build it.
    evict: bool = False


@dataclass(slots=True)
class VersionLoaded:
    """worker -> FE: ``key`` is built (and, in the executor, warmed up) and serves."""
    T: ClassVar[str] = "version_loaded"
    worker: str
    key: str
    seconds: float = 0.0
    # The worker's RSS growth across the build (bytes): the executor's is the session's footprint,
    # which the model pool (frontend/versions/pool.py) budgets.  0 when not measured, which includes a build
    # that another build or an unload overlapped (aieng/runtime/footprint.py: its growth was not its own).
    # Serving threads still allocate meanwhile: an estimate, not an exact count.
    footprint_bytes: int = 0
    # GPU memory this process gained across the build (NVML, per process; 0 without a CUDA session, or
    # when not quiet, as above).
    gpu_footprint_bytes: int = 0


@dataclass(slots=True)
class VersionFailed:
    """worker -> FE: ``key`` could not be built; ``error`` says why (one line)."""
    T: ClassVar[str] = "version_failed"
    worker: str
    key: str
    error: str


TYPES: dict[str, type] = {
    cls.T: cls for cls in (Hello, PreTask, Preprocessed, InferTask, Inferred, PostTask, PostBatch, Result,
                           Failed, Bundle, Soon, WorkerDown, ServiceState, Pulse, LogLevel, Drain, Drained,
                           Reload, Reloaded, LoadVersion, UnloadVersion, VersionLoaded, VersionFailed)
}
_CODECS = {name: codecs(cls) for name, cls in TYPES.items()}  # nested records: how each travels


def _check_registry() -> None:
    """Import-time check: every message dataclass in this module is registered under its tag."""
    declared = {obj for obj in globals().values()
                if isinstance(obj, type) and dataclasses.is_dataclass(obj) and hasattr(obj, "T")}
    missing = declared - set(TYPES.values())
    if missing or len(TYPES) != len(declared):
        raise RuntimeError(f"messages not registered in TYPES: {sorted(c.__name__ for c in missing)}")


_check_registry()
_PLANS = {tag: plan(cls, _CODECS[tag]) for tag, cls in TYPES.items()}  # what ``encode`` reads of each


def encode(msg: Any) -> bytes:
    get, plain, coded = _PLANS[msg.T]
    data = {"t": msg.T}
    data.update(zip(plain, get(msg)))
    for name, shape, enc in coded:
        value = getattr(msg, name)
        if value is not None:
            value = enc(value) if shape == "one" else (
                [enc(v) for v in value] if shape == "list" else {k: enc(v) for k, v in value.items()})
        data[name] = value
    return msgpack.packb(data, use_bin_type=True)


# Internal messages come from our own processes, but are unpacked with limits all the same.  They
# carry client-supplied params, so the limits are those of the client protocol (``configure``).
_LIMITS: dict[str, int] = {}


def configure(max_message_bytes: int) -> None:
    """Derive the internal unpack limits from the client limits (called at each process start)."""
    from aieng.wire.protocol import unpack_limits

    _LIMITS.clear()
    _LIMITS.update(unpack_limits(max_message_bytes))


configure(32 * 1024 * 1024)


def unpack_internal(data: bytes | memoryview) -> Any:
    """msgpack from one of our own processes (a message, a packed spec), within the internal limits."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, **_LIMITS)


def bundled(items: list[bytes]) -> bytes:
    """One encoded message for ``items`` (encoded messages): the item itself when there is only one."""
    return items[0] if len(items) == 1 else encode(Bundle(items))


def decode(data: bytes | memoryview) -> Any:
    obj = unpack_internal(data)
    tag = obj.pop("t")
    for name, (shape, _enc, dec) in _CODECS[tag].items():
        value = obj.get(name)
        if value is not None:
            obj[name] = dec(value) if shape == "one" else (
                [dec(v) for v in value] if shape == "list" else {k: dec(v) for k, v in value.items()})
    return TYPES[tag](**obj)
