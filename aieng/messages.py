"""Every message that crosses a process boundary inside aieng, declared once.

The field names are the internal protocol.  Messages are msgpack maps with a
``t`` tag naming the type; receivers route on it with a dispatch table.  All
internal traffic goes over one ROUTER socket in the frontend (the hub) that
every worker and the supervisor connect to as a DEALER with its worker name as
identity.  Tensors never travel here: a :class:`Ref` names a shared-memory
slot (see ``aieng.shm``).

Flow of one inference request (the frontend stamps each arrival)::

    client -> FE            request (protocol.py)
    FE -> pre[i]            PreTask + the client's raw request frame
    pre[i] -> FE            Preprocessed (slot in pre[i]'s ring) | Failed
    FE -> executor          InferTask
    executor -> FE          Inferred: one message per batch, a row per request | Failed
    FE -> post[j]           PostTask
    post[j] -> FE           Result (outputs already msgpack-packed) | Failed
    FE -> client            response

Unpack limits are derived from the client protocol's (``configure``): every
internal message may carry client-supplied ``params``, so whatever the
frontend accepted a worker can decode.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import msgpack


@dataclass(slots=True)
class Ref:
    """Where one request's tensors lie: ring segment, slot, generation, tensors.

    ``tensors`` holds ``[name, dtype str, shape, offset]`` per tensor.  On the
    wire a Ref is the list ``[seg, slot, gen, tensors]``.
    """
    seg: str
    slot: int
    gen: int
    tensors: list

    def wire(self) -> list:
        return [self.seg, self.slot, self.gen, self.tensors]


@dataclass(slots=True)
class Hello:
    """Worker -> FE once it is ready to take work, then once a second as its heartbeat."""
    T: ClassVar[str] = "hello"
    worker: str
    role: str
    pid: int
    info: dict = field(default_factory=dict)  # what health/models show: ring, models, runtime, failed


@dataclass(slots=True)
class PreTask:
    T: ClassVar[str] = "pre"
    rid: int
    model: str
    version: str
    deadline: float  # CLOCK_MONOTONIC seconds, same clock in every process
    trace: str = ""  # the request's trace id, for log lines


@dataclass(slots=True)
class Preprocessed:
    T: ClassVar[str] = "preprocessed"
    rid: int
    ref: Ref
    seq_len: int  # batching key: longest variable dimension (0: fixed shapes)
    pre_us: int
    features: dict = field(default_factory=dict)  # tabular feature values, for input-drift monitoring


@dataclass(slots=True)
class InferTask:
    T: ClassVar[str] = "infer"
    rid: int
    model: str
    version: str
    deadline: float
    ref: Ref
    seq_len: int
    upstream: int  # requests of this model still in preprocessing: more may come
    trace: str = ""


@dataclass(slots=True)
class Inferred:
    """Executor -> FE once per batch: row ``i`` is request ``rids[i]``, its outputs at ``refs[i]``."""
    T: ClassVar[str] = "inferred"
    rids: list
    refs: list  # list[Ref]
    wait_us: list  # per row: from arrival at the executor to the start of its batch
    batch: int  # rows in the batch
    padded: int  # padded sequence length of the batch
    infer_us: int


@dataclass(slots=True)
class PostTask:
    T: ClassVar[str] = "post"
    rid: int
    model: str
    version: str
    ref: Ref
    params: dict  # the client's params, as sent
    degraded: int = 0  # the model's degradation level at admission (1+: skip optional steps)
    trace: str = ""


@dataclass(slots=True)
class Result:
    T: ClassVar[str] = "result"
    rid: int
    outputs: bytes  # a packed msgpack map: output name -> value
    post_us: int
    confidence: float | None = None  # top class probability, for classifiers (a metric)


@dataclass(slots=True)
class Failed:
    """Any stage failing one request.  ``ref`` is a slot the FE must free, if any."""
    T: ClassVar[str] = "failed"
    rid: int
    code: str
    message: str
    ref: Optional[Ref] = None


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
    processes: dict
    restarts: dict


@dataclass(slots=True)
class Pulse:
    """FE -> supervisor twice a second: is the pipeline healthy, and how long has each
    worker been silent (seconds since its last heartbeat)."""
    T: ClassVar[str] = "pulse"
    healthy: bool
    silent: dict


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


TYPES: dict[str, type] = {
    cls.T: cls for cls in (Hello, PreTask, Preprocessed, InferTask, Inferred, PostTask, Result,
                           Failed, WorkerDown, ServiceState, Pulse, LogLevel, Drain, Drained)
}
_FIELDS = {name: tuple(f.name for f in dataclasses.fields(cls)) for name, cls in TYPES.items()}


def _ref_fields(cls: type) -> tuple[frozenset, frozenset]:
    """Fields holding a Ref (or None), and fields holding a list of Refs."""
    hints = typing.get_type_hints(cls)
    one = frozenset(n for n, h in hints.items() if h is Ref or h == Optional[Ref])
    many = frozenset(f.name for f in dataclasses.fields(cls) if f.name == "refs")
    return one, many


_REFS = {name: _ref_fields(cls) for name, cls in TYPES.items()}


def _check_registry() -> None:
    """Import-time check: every message dataclass in this module is registered under its tag."""
    declared = {obj for obj in globals().values()
                if isinstance(obj, type) and dataclasses.is_dataclass(obj) and hasattr(obj, "T")}
    missing = declared - set(TYPES.values())
    if missing or len(TYPES) != len(declared):
        raise RuntimeError(f"messages not registered in TYPES: {sorted(c.__name__ for c in missing)}")


_check_registry()


def encode(msg: Any) -> bytes:
    data = {"t": msg.T}
    one, many = _REFS[msg.T]
    for name in _FIELDS[msg.T]:
        value = getattr(msg, name)
        if name in one and value is not None:
            value = value.wire()
        elif name in many:
            value = [r.wire() for r in value]
        data[name] = value
    return msgpack.packb(data, use_bin_type=True)


# Internal messages come from our own processes, but are unpacked with limits all the same.  They
# carry client-supplied params, so the limits are those of the client protocol (``configure``).
_LIMITS: dict[str, int] = {}


def configure(max_message_bytes: int) -> None:
    """Derive the internal unpack limits from the client limits (called at each process start)."""
    from aieng.protocol import unpack_limits

    _LIMITS.clear()
    _LIMITS.update(unpack_limits(max_message_bytes))


configure(32 * 1024 * 1024)


def decode(data: bytes | memoryview) -> Any:
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False, **_LIMITS)
    tag = obj.pop("t")
    cls = TYPES[tag]
    one, many = _REFS[tag]
    for name in one:
        if obj.get(name) is not None:
            obj[name] = Ref(*obj[name])
    for name in many:
        obj[name] = [Ref(*r) for r in obj[name]]
    return cls(**obj)
