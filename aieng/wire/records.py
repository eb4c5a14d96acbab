"""The records nested in internal messages (``messages``): a request's shared-memory slot (``Ref``), its
clock readings (``Trail``), an image's sizes (``Geometry``), one request of a batch sent to postprocessing
(``PostItem``), a postprocess step (``Step``) and a supervised process (``ProcessState``).  Each travels as
a list and comes back as its type.  ``Packed`` is a map kept as msgpack bytes (the executor's per-session
facts, the models op's list): it travels as bytes and is decoded only when read; ``protocol.pack_map``
splices it into a reply as it is.  ``codecs`` and ``plan`` work out once per message class how
``messages.encode``/``decode`` carry these records and read the rest."""
from __future__ import annotations

import dataclasses
import operator
import typing
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import msgpack

from aieng.models.spec import ModelSpec


@dataclass(slots=True)
class Ref:
    """Where one request's tensors lie: ring segment, slot, generation, tensors.

    ``tensors`` holds ``[name, dtype str, shape, offset]`` per tensor.  On the
    wire a Ref is the list ``[seg, slot, gen, tensors]``.
    """
    seg: str
    slot: int
    gen: int
    tensors: list[list]  # [name, dtype str, shape, offset] each

    def wire(self) -> list:
        return [self.seg, self.slot, self.gen, self.tensors]

    def place(self) -> "Ref":
        """The slot without its tensors: what a notice to the frontend carries (it only ever frees the slot;
        the tensors' descriptions would cost encoding and decoding a row on every notice)."""
        return Ref(self.seg, self.slot, self.gen, [])


@dataclass(slots=True)
class Trail:
    """Clock readings (monotonic seconds) and sizes a request collects on its way; a list on the wire."""
    pre_started: float = 0.0  # its preprocess group began
    pre_sent: float = 0.0  # its tensors were written and it left for the executor
    exec_arrived: float = 0.0
    batch_started: float = 0.0
    infer_us: int = 0  # the run of its batch
    seq_len: int = 0  # its own sequence length (0: fixed shapes)
    batch: int = 1  # rows in that batch
    padded: int = 0  # padded sequence length of that batch
    post_started: float = 0.0
    post_us: int = 0

    def wire(self) -> list:
        return list(_TRAIL_GET(self))


_TRAIL_GET = operator.attrgetter(*(f.name for f in dataclasses.fields(Trail)))  # its fields, in order


@dataclass(slots=True)
class Geometry:
    """An image request's sizes, set by its preprocessing for the postprocessing that maps boxes back to
    the page: the page as decoded (``page_h`` x ``page_w``) and the part of the model input its content
    fills (``input_h`` x ``input_w``; batch padding lies beyond it).  A list on the wire."""
    page_h: int
    page_w: int
    input_h: int
    input_w: int

    def wire(self) -> list:
        return [self.page_h, self.page_w, self.input_h, self.input_w]


@dataclass(slots=True)
class PostItem:
    """One request of a ``PostBatch``: what a ``PostTask`` carries besides its model and its slot (the
    batch's).  A list on the wire, its ``Trail`` and ``Geometry`` as theirs."""
    rid: int
    params: dict[str, Any]
    degraded: int
    trace: str
    trail: Trail
    geometry: Optional[Geometry]
    features: dict[str, float]
    request: Optional[bytes]

    def wire(self) -> list:
        g = self.geometry
        return [self.rid, self.params, self.degraded, self.trace, self.trail.wire(),
                None if g is None else g.wire(), self.features, self.request]

    @staticmethod
    def unwire(v: list) -> "PostItem":
        g = v[5]
        return PostItem(v[0], v[1], v[2], v[3], Trail(*v[4]), None if g is None else Geometry(*g), v[6], v[7])


class Step(NamedTuple):
    """One postprocess step a request went through: a list on the wire."""
    name: str
    us: int  # microseconds
    outcome: str  # "ok" | "skipped" | "timeout"


@dataclass(slots=True)
class ProcessState:
    """One supervised process as health shows it; a list on the wire."""
    role: str
    pid: Optional[int]
    alive: bool
    restarts: int

    def wire(self) -> list:
        return [self.role, self.pid, self.alive, self.restarts]

    def view(self) -> dict:
        return {"role": self.role, "pid": self.pid, "alive": self.alive, "restarts": self.restarts}


@dataclass(frozen=True, slots=True)
class Packed:
    """A map shown, not used, by its holder, kept as its msgpack bytes: the frontend holds the executor's
    session facts (about 4 KiB of Python objects a model, decoded every heartbeat) as one bytes object and
    decodes them only when the ``models`` op's list is built, and keeps that list packed too (rebuilt only
    when what it shows changes).  Equal when the bytes are equal."""
    blob: bytes = b"\x80"  # msgpack's empty map

    @staticmethod
    def of(value: dict) -> "Packed":
        return Packed(msgpack.packb(value, use_bin_type=True))

    def wire(self) -> bytes:
        return self.blob

    def thaw(self) -> dict[str, Any]:
        # Unpacked from our own executor's message, which the hub unpacked within the internal limits: the
        # blob is bounded by them, and no container in it can be longer than the blob.
        return msgpack.unpackb(self.blob, raw=False, strict_map_key=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.thaw().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.thaw()[key]

    def __bool__(self) -> bool:
        return self.blob != b"\x80"


# Nested records: how each travels (encode) and comes back (decode).  A field may hold one (or None),
# a list of them or a map of them; every other field travels as msgpack has it.
_RECORDS: dict[type, tuple[Any, Any]] = {
    Ref: (Ref.wire, lambda v: Ref(*v)), Trail: (Trail.wire, lambda v: Trail(*v)),
    Geometry: (Geometry.wire, lambda v: Geometry(*v)),
    ProcessState: (ProcessState.wire, lambda v: ProcessState(*v)),
    PostItem: (PostItem.wire, PostItem.unwire), Step: (None, lambda v: Step(*v)),
    ModelSpec: (ModelSpec.to_dict, ModelSpec.from_dict),
    Packed: (Packed.wire, Packed),
}


def _codec(hint: Any) -> tuple[str, Any, Any] | None:
    """``(shape, encode, decode)`` for a field of a nested record type; shape is one, list or map."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if hint in _RECORDS:
        return ("one", *_RECORDS[hint])
    if origin is typing.Union and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        return ("one", *_RECORDS[inner]) if inner in _RECORDS else None
    if origin is list and args and args[0] in _RECORDS:
        return ("list", *_RECORDS[args[0]])
    if origin is dict and len(args) == 2 and args[1] in _RECORDS:
        return ("map", *_RECORDS[args[1]])
    return None


def codecs(cls: type) -> dict[str, tuple[str, Any, Any]]:
    """``{field: (shape, encode, decode)}`` for a message class's fields that hold nested records."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        c = _codec(hints[f.name])
        if c is not None:
            out[f.name] = c
    return out


def plan(cls: type, coded: dict[str, tuple[str, Any, Any]]) -> tuple[Any, tuple[str, ...], tuple]:
    """How a message of ``cls`` is encoded: one getter for its plain fields (their names, in order) and
    the fields holding nested records (``coded``, from ``codecs``), each with its shape and encoder."""
    nested = tuple((n, c[0], c[1]) for n, c in coded.items() if c[1] is not None)
    skip = {n for n, _, _ in nested}
    plain = tuple(f.name for f in dataclasses.fields(cls) if f.name not in skip)
    get = operator.attrgetter(*plain) if len(plain) > 1 else (
        (lambda msg, n=plain[0]: (getattr(msg, n),)) if plain else (lambda msg: ()))
    return get, plain, nested
