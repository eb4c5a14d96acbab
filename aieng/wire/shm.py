"""Shared-memory slot rings: how tensors cross process boundaries.

Each producer (a preprocess worker, the executor) owns exactly one ring (``Ring``, whose docstring
draws the layout), a POSIX shared-memory segment ``/dev/shm/aieng.<instance>.<worker>.<pid>``.  One
slot holds all tensors of one request; only ``[name, dtype, shape, offset]`` descriptors and
``(segment, slot, gen)`` travel in the control messages, never the bytes.  A ring may have two size
classes (``alloc`` never takes a slot of the other class), so small requests never wait behind big
ones.  The producer allocates a slot; exactly one party frees it, once nobody will read it again
(``free`` checks ``gen``, so a stale free is a no-op); a slot BUSY beyond ``lease_s`` is reclaimed by
the producer.  When no slot of its class is free the producer waits (backpressure); a request that
does not fit the largest slot fails.  A string tensor is written packed (``strings``: per element a
4-byte length and its bytes, descriptor dtype ``"|O"``) and read back as an object array.  Who frees
which slot at each stage, on success, error, timeout and a worker's death: the table in
``frontend/requests/table.py``'s docstring; the ordering argument and the lease:
docs/architecture.md, 'Shared-memory rings'.  Consumers attach lazily (``RingCache``).
"""
from __future__ import annotations

import math
import mmap
import os
import re
import struct
import time
from collections import OrderedDict
from typing import Any, Iterable

import numpy as np

from aieng.wire import strings

SHM_DIR = "/dev/shm"
PREFIX = "aieng."
MAGIC = 0x4E454941  # "AIEN"
VERSION = 2  # 2: the size classes (nsmall, small_bytes)
ALIGN = 64
FIXED = 32  # the header's fixed fields: struct "<IIIIQQ"
FREE, BUSY = 0, 1
_FREE_BYTE = bytes([FREE])

_NAME_RE = re.compile(r"^aieng\.([0-9]+)\.")
_DTYPES: dict[str, np.dtype] = {}  # a descriptor's dtype string -> its dtype (0.05 us against 0.6 to build)


def _dtype(code: str) -> np.dtype:
    dt = _DTYPES.get(code)
    if dt is None:
        dt = np.dtype(code)
        if len(_DTYPES) < 64:  # numpy's dtypes are few; never more than that many kept
            _DTYPES[code] = dt
    return dt


def segment_name(instance: str, worker: str, pid: int) -> str:
    return f"{PREFIX}{instance}.{worker}.{pid}"


def lease_for(max_timeout_ms: int) -> float:
    """How long a slot may stay BUSY before its producer reclaims it: twice the longest deadline a
    request may have plus a margin, so only a slot whose holder died is ever reclaimed."""
    return 2 * max_timeout_ms / 1000 + 30


def header_bytes(nslots: int) -> int:
    """Header size for a ring of ``nslots``: fixed fields + state/gen/leased, page aligned."""
    return (FIXED + nslots + 8 + 4 * nslots + 8 + 8 * nslots + 4095) & ~4095


def page_round(nbytes: int) -> int:
    return (nbytes + 4095) & ~4095


def payload_bytes(tensors: list[tuple[str, np.ndarray]]) -> int:
    """The bytes ``Ring.write`` uses for ``tensors`` (each 64-byte aligned): which class they need."""
    off = 0
    for _, arr in tensors:
        arr = np.asarray(arr)
        nbytes = strings.packed_size(arr) if arr.dtype.hasobject else arr.nbytes
        off = (off + nbytes + ALIGN - 1) & ~(ALIGN - 1)
    return off


class Segment:
    """A named shared-memory mapping with explicit create/attach/close/unlink."""

    def __init__(self, name: str, size: int = 0, create: bool = False):
        if "/" in name or not name.startswith(PREFIX):
            raise ValueError(f"bad segment name {name!r}")
        self.name = name
        self.path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self.size = size
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buf = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> None:
        if self.mm is None:
            return
        self.buf = None  # type: ignore[assignment]
        try:
            self.mm.close()
        except BufferError:
            return  # a view is still alive; the mapping goes with the process
        self.mm = None  # type: ignore[assignment]

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Ring:
    """A slot ring over one segment; the owner creates it, others attach.  The segment::

        +------------------ header (header_bytes(nslots), page aligned) ---------+
        | magic u32 | version u32 | nslots u32 | nsmall u32 | slot_bytes u64    |
        | small_bytes u64                                                        |
        | state  u8[nslots]   0 = FREE, 1 = BUSY                                 |
        | gen    u32[nslots]  bumped by the producer at every allocation         |
        | leased f64[nslots]  CLOCK_MONOTONIC seconds of the allocation          |
        +--------------------------- data --------------------------------------+
        | small slot 0 (small_bytes) | ... | small slot nsmall-1 |               |
        | slot nsmall (slot_bytes)   | ... | slot nslots-1                       |
        +-----------------------------------------------------------------------+

    The producer allocates a slot (FREE -> BUSY, gen += 1, lease stamped) and writes each tensor 64-byte
    aligned; exactly one party frees it (BUSY -> FREE): the consumer that read it (the executor after
    assembling a batch, a postprocess worker after reading an output) or the frontend when the request
    ended elsewhere (timeout, a dead consumer, a failure).  State bytes are written by one party at a
    time; on x86 (TSO) a consumer's reads of the data complete before its FREE store becomes visible, and
    the ZMQ message that carries a descriptor orders the producer's writes before them.
    """

    def __init__(self, segment: Segment, nslots: int | None = None, slot_bytes: int | None = None,
                 lease_s: float = 600.0, nsmall: int = 0, small_bytes: int = 0):
        self.seg = segment
        self.lease_s = lease_s
        hdr = segment.buf
        if nslots is not None:  # creating
            struct.pack_into("<IIIIQQ", segment.mm, 0, MAGIC, VERSION, nslots, nsmall, slot_bytes,
                             small_bytes)
        magic, version, n, ns, sb, small = struct.unpack_from("<IIIIQQ", segment.mm, 0)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{segment.name}: not an aieng ring")
        self.nslots, self.slot_bytes, self.nsmall, self.small_bytes = n, sb, ns, small
        self.data_start = header_bytes(n)
        self.big_start = self.data_start + ns * small  # where the slot_bytes slots begin
        off = FIXED
        self.state = hdr[off:off + n]
        off = (off + n + 7) & ~7
        self.gen = hdr[off:off + 4 * n].view(np.uint32)
        off += 4 * n
        off = (off + 7) & ~7
        self.leased = hdr[off:off + 8 * n].view(np.float64)

    # -- producer side ------------------------------------------------------
    @classmethod
    def create(cls, name: str, nslots: int, slot_bytes: int, lease_s: float = 600.0, nsmall: int = 0,
               small_bytes: int = 0) -> "Ring":
        """``nslots`` slots, the first ``nsmall`` of them of ``small_bytes`` (sizes page-rounded)."""
        if not 1 <= nslots <= 65536:
            raise ValueError("a ring has 1..65536 slots")
        slot_bytes, small_bytes = page_round(slot_bytes), page_round(small_bytes) if nsmall else 0
        if not 0 <= nsmall < nslots or small_bytes > slot_bytes:
            raise ValueError("small slots: 0..nslots-1 of them, no bigger than the others")
        seg = Segment(name, header_bytes(nslots) + nsmall * small_bytes + (nslots - nsmall) * slot_bytes,
                      create=True)
        return cls(seg, nslots, slot_bytes, lease_s, nsmall, small_bytes)

    def alloc(self, nbytes: int = 0) -> tuple[int, int] | None:
        """Take a FREE slot of the class ``nbytes`` fits (the big class when it fits neither: ``write``
        refuses it): ``(slot, gen)``, or None when that class is full."""
        small = self.nsmall and nbytes <= self.small_bytes
        lo, hi = (0, self.nsmall) if small else (self.nsmall, self.nslots)
        at = self.state[lo:hi].tobytes().find(_FREE_BYTE)  # the lowest: keeps the touched pages few
        if at < 0:
            self.reclaim()
            at = self.state[lo:hi].tobytes().find(_FREE_BYTE)
            if at < 0:
                return None
        slot = lo + at
        gen = (int(self.gen[slot]) + 1) & 0xFFFFFFFF
        self.gen[slot] = gen
        self.leased[slot] = time.monotonic()
        self.state[slot] = BUSY
        return slot, gen

    def reclaim(self) -> int:
        """Free slots BUSY past their lease (their holder died); returns how many."""
        stale = np.flatnonzero((self.state == BUSY) & (self.leased < time.monotonic() - self.lease_s))
        self.state[stale] = FREE
        return int(stale.size)

    def write(self, slot: int, tensors: Iterable[tuple[str, np.ndarray]]) -> list[list[Any]]:
        """Copy tensors into a slot; returns their descriptors."""
        base, size = self.where(slot)
        off = 0
        descs = []
        for name, arr in tensors:
            arr = np.asarray(arr)
            if arr.dtype.hasobject:  # a string tensor: its packed elements (``strings``)
                blob = strings.pack(arr)
                if off + len(blob) > size:
                    raise OverflowError(f"tensors need more than the {size}-byte slot")
                self.seg.buf[base + off: base + off + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
                descs.append([name, strings.OBJECT, list(arr.shape), off])
                off = (off + len(blob) + ALIGN - 1) & ~(ALIGN - 1)
                continue
            nbytes = arr.nbytes
            if off + nbytes > size:
                raise OverflowError(f"tensors need more than the {size}-byte slot")
            dst = self.seg.buf[base + off: base + off + nbytes].view(arr.dtype).reshape(arr.shape)
            np.copyto(dst, arr, casting="no")
            descs.append([name, arr.dtype.str, list(arr.shape), off])
            off = (off + nbytes + ALIGN - 1) & ~(ALIGN - 1)
        return descs

    def in_use(self) -> int:
        return int(np.count_nonzero(self.state))

    def where(self, slot: int) -> tuple[int, int]:
        """``(offset, bytes)`` of a slot in the segment."""
        if slot < self.nsmall:
            return self.data_start + slot * self.small_bytes, self.small_bytes
        return self.big_start + (slot - self.nsmall) * self.slot_bytes, self.slot_bytes

    # -- consumer side ------------------------------------------------------
    def views(self, slot: int, descs: list[list[Any]]) -> dict[str, np.ndarray]:
        base, size = self.where(slot)
        out = {}
        for name, dtype, shape, off in descs:
            if dtype == strings.OBJECT:  # a string tensor: a copy, as an object array of bytes
                out[name] = strings.unpack(self.seg.buf, base + off, base + size, shape)
                continue
            dt = _dtype(dtype)
            count = math.prod(shape)
            start = base + off
            out[name] = self.seg.buf[start:start + count * dt.itemsize].view(dt).reshape(shape)
        return out

    def holds(self, slot: int, gen: int) -> bool:
        """Is the slot still BUSY with this generation?  False once its request ended elsewhere
        (the frontend freed it when a holder died) and the producer may have reused it."""
        return 0 <= slot < self.nslots and int(self.gen[slot]) == gen and bool(self.state[slot] == BUSY)

    def free(self, slot: int, gen: int) -> bool:
        if 0 <= slot < self.nslots and int(self.gen[slot]) == gen and self.state[slot] == BUSY:
            self.state[slot] = FREE
            return True
        return False

    def close(self) -> None:
        self.state = self.gen = self.leased = None  # type: ignore[assignment]
        self.seg.close()


class RingCache:
    """Consumer-side attachments to other processes' rings, opened lazily."""

    def __init__(self, limit: int = 32):
        self.limit = limit
        self.rings: OrderedDict[str, Ring] = OrderedDict()

    def get(self, name: str) -> Ring:
        ring = self.rings.get(name)
        if ring is None:
            ring = Ring(Segment(name))
            self.rings[name] = ring
            while len(self.rings) > self.limit:
                _, old = self.rings.popitem(last=False)
                old.close()
        else:
            self.rings.move_to_end(name)
        return ring

    def free(self, name: str, slot: int, gen: int) -> bool:
        try:
            return self.get(name).free(slot, gen)
        except (FileNotFoundError, ValueError):
            return False  # the producer is gone and its segment with it

    def release(self, ref) -> bool:
        """Free the slot a ``messages.Ref`` names (a stale or repeated free is a no-op)."""
        return self.free(ref.seg, ref.slot, ref.gen)

    def forget(self, name_prefix: str) -> None:
        for name in [n for n in self.rings if n.startswith(name_prefix)]:
            self.rings.pop(name).close()

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()


def list_segments(instance: str | None = None) -> list[str]:
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:  # pragma: no cover
        return []
    pref = PREFIX if instance is None else f"{PREFIX}{instance}."
    return sorted(n for n in names if n.startswith(pref))


def unlink_prefix(prefix: str) -> list[str]:
    gone = []
    for name in list_segments():
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                gone.append(name)
            except FileNotFoundError:
                pass
    return gone


def clean_stale(alive=None) -> list[str]:
    """Unlink segments whose owning instance (the supervisor pid) is gone."""
    import psutil

    alive = alive or psutil.pid_exists
    gone = []
    for name in list_segments():
        m = _NAME_RE.match(name)
        if m and not alive(int(m.group(1))):
            gone += unlink_prefix(f"{PREFIX}{m.group(1)}.")
    return gone
