"""The records nested in internal messages (``messages``): a request's shared-memory slot (``Ref``), its
clock readings (``Trail``), an image's sizes (``Geometry``), a postprocess step (``Step``) and a supervised
process (``ProcessState``).  Each travels as a list and comes back as its type.  ``Packed`` is a map kept
as msgpack bytes (the executor's per-session facts, the models op's list): it travels as bytes and is
decoded only when read; ``protocol.pack_map`` splices it into a reply as it is."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

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
    tensors: list[list]  # [name, dtype str, shape, offset] each

    def wire(self) -> list:
        return [self.seg, self.slot, self.gen, self.tensors]


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
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


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
