"""Tensors by system shared-memory region: an input read from one, a requested output written into one.

An input or a requested output whose ``parameters`` give ``shared_memory_region`` (with
``shared_memory_byte_size``, and ``shared_memory_offset``, default 0) names a window of a registered
region (``sysshm.SystemShm``).  An input's window is read (copied) when the request is decoded and
must hold exactly the tensor's bytes for its datatype and shape (``codec.from_raw``'s check; ``BYTES``
elements length-prefixed as in the binary extension).  An output's window is checked against the
region before the request is sent, and the output is written there after inference; it must fit, as
Triton says it must ("should be at least N bytes to hold the results").  The answer then carries the
output's name, datatype, shape and these parameters, and no data.  Both transports use these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from aieng.gateway import codec
from aieng.gateway.decode import OFF_LOOP_BYTES
from aieng.gateway.peers import Caller
from aieng.gateway.sysshm import SystemShm, check_size
from aieng.wire import protocol as p

REGION, OFFSET, BYTE_SIZE = "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"


@dataclass
class ShmRef:
    region: str
    offset: int
    byte_size: int

    def params(self, written: int) -> dict[str, Any]:
        out: dict[str, Any] = {REGION: self.region, BYTE_SIZE: written}
        if self.offset:
            out[OFFSET] = self.offset
        return out


def ref_of(params: Mapping[str, Any] | None, what: str) -> ShmRef | None:
    """The window ``params`` name (None: the tensor does not use shared memory)."""
    if not isinstance(params, Mapping) or params.get(REGION) is None:
        return None
    region = params[REGION]
    if not isinstance(region, str) or not region:
        raise p.RequestError(p.INVALID_INPUT, f"{what}: '{REGION}' must be a region's name")
    if params.get(BYTE_SIZE) is None:
        raise p.RequestError(p.INVALID_INPUT, f"{what}: '{REGION}' needs '{BYTE_SIZE}'")
    return ShmRef(region, check_size(params.get(OFFSET, 0), f"{what}: '{OFFSET}'"),
                  check_size(params[BYTE_SIZE], f"{what}: '{BYTE_SIZE}'"))


def decode_size(size: int, reads_shm: bool) -> int:
    """A request's weight for the decoder (``decode.py``): one that reads from a region is decoded off
    the loop whatever its own size, since the bytes it decodes are not in the message."""
    return max(size, OFF_LOOP_BYTES + 1) if reads_shm else size


def read_input(shm: SystemShm, caller: Caller, name: Any, datatype: Any, shape: Any,
               ref: ShmRef) -> codec.Tensor:
    """The input tensor held in ``ref``'s window: exactly its bytes for ``datatype`` and ``shape``."""
    codec.check_head(name, datatype, shape)
    raw = shm.read(caller, ref.region, ref.offset, ref.byte_size, f"input '{name}'")
    return codec.from_raw(name, datatype, shape, raw)


def check_outputs(shm: SystemShm, caller: Caller, refs: dict[str, ShmRef]) -> None:
    """Every output window lies in a registered region (before the request is sent)."""
    for name, ref in refs.items():
        shm.check(caller, ref.region, ref.offset, ref.byte_size, f"output '{name}'")


def write_outputs(shm: SystemShm, caller: Caller, outputs: list[tuple[str, str, np.ndarray]],
                  refs: dict[str, ShmRef]) -> dict[str, int]:
    """Write each output that has a window into it; the bytes written, by output name."""
    written = {}
    for name, dt, arr in outputs:
        ref = refs.get(name)
        if ref is None:
            continue
        raw = codec.raw_of(dt, arr)
        if len(raw) > ref.byte_size:
            raise p.RequestError(p.INVALID_INPUT, f"shared memory size specified with the request for output "
                                                  f"'{name}' ({ref.byte_size} bytes) should be at least "
                                                  f"{len(raw)} bytes to hold the results")
        shm.write(caller, ref.region, ref.offset, raw, f"output '{name}'")
        written[name] = len(raw)
    return written
