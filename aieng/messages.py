"""Every message that crosses a process boundary inside aieng, declared once.

The field names are the internal protocol.  Messages are msgpack maps with a
``t`` tag naming the type; receivers route on it with a dispatch table.  All
internal traffic goes over one ROUTER socket in the frontend (the hub) that
every worker and the supervisor connect to as a DEALER with its worker name as
identity.  Tensors never travel here: a ``TensorRef`` names a shared-memory
slot (see ``aieng.shm``).

Flow of one inference request (the frontend stamps each arrival)::

    client -> FE            request (protocol.py)
    FE -> pre[i]            PreTask + the client's raw request frame
    pre[i] -> FE            Preprocessed (slot in pre[i]'s ring) | Failed
    FE -> executor          InferTask
    executor -> FE          Inferred (slot in the executor's ring) | Failed
    FE -> post[j]           PostTask
    post[j] -> FE           Result (outputs already msgpack-packed) | Failed
    FE -> client            response
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack




@dataclass(slots=True)
class Ref:
    """Where one request's tensors lie: ring segment, slot, generation, tensors."""
    seg: str
    slot: int
    gen: int
    tensors: list  # [[name, dtype str, shape, offset], ...]


@dataclass(slots=True)
class Hello:
    """Worker -> FE once it is ready to take work (also after a restart)."""
    T: ClassVar[str] = "hello"
    worker: str
    role: str
    pid: int
    info: dict = field(default_factory=dict)


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
    ref: list  # Ref fields as a list: [seg, slot, gen, tensors]
    seq_len: int  # batching key: longest variable dimension (0: fixed shapes)
    pre_us: int
    info: dict = field(default_factory=dict)  # small per-request facts for postprocessing


@dataclass(slots=True)
class InferTask:
    T: ClassVar[str] = "infer"
    rid: int
    model: str
    version: str
    deadline: float
    ref: list
    seq_len: int
    upstream: int  # requests of this model still in preprocessing: more may come
    trace: str = ""


@dataclass(slots=True)
class Inferred:
    T: ClassVar[str] = "inferred"
    rid: int
    ref: list
    batch: int  # rows in the batch this request ran in
    padded: int  # padded sequence length of that batch
    wait_us: int  # from arrival at the executor to the start of its batch
    infer_us: int


@dataclass(slots=True)
class PostTask:
    T: ClassVar[str] = "post"
    rid: int
    model: str
    version: str
    ref: list
    params: dict
    info: dict
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
    ref: list | None = None


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


def encode(msg: Any) -> bytes:
    data = {"t": msg.T}
    for name in _FIELDS[msg.T]:
        data[name] = getattr(msg, name)
    return msgpack.packb(data, use_bin_type=True)


# Internal messages come from our own processes, but are unpacked with limits all the same.
_LIMITS = dict(max_str_len=1 << 20, max_bin_len=1 << 28, max_array_len=1 << 16, max_map_len=1 << 16, max_ext_len=0)


def decode(data: bytes | memoryview) -> Any:
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False, **_LIMITS)
    cls = TYPES[obj.pop("t")]
    return cls(**obj)
