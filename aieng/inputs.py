"""A request's inputs checked against a model version's declared ones, without its processor or session.

``validate_inputs`` is the check every preprocessing path runs first (the preprocess worker, the
executor's direct route, the baseline): each input is declared, of its declared kind and finite; every
required one is there.  ``precheck`` adds what a tensor-in model's processor would refuse from the
tensor map's header alone (dtype, shape, byte count: ``protocol.decode_tensor``, O(1), no copy); the
frontend runs it before a request may start a cold load (``versions/poolctl.py``), so a request that would
fail INVALID_INPUT never loads or evicts a version.  Same codes and messages as the workers' (one code
path).  Not checked here: anything that needs the data read (NaN in a tensor, an image's decoding) or
the session (shapes against the model's inputs): those stay in the workers.  ``image_size`` reads an
image's width and height from its PNG/JPEG header (the image processor's bomb check, and ``image_pixels``,
what the frontend's direct route weighs an image request by), without OpenCV.
"""
from __future__ import annotations

import math
import struct
from typing import Any

from aieng.model_repo import ModelSpec
from aieng.preprocess_workers.image_config import DEFAULT_INPUT as DEFAULT_IMAGE_INPUT
from aieng.wire.protocol import INVALID_INPUT, RequestError, decode_tensor

_KIND_CHECKS = {
    "text": lambda v: isinstance(v, str),
    "image": lambda v: isinstance(v, (bytes, bytearray)),
    "number": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
    "category": lambda v: v is None or isinstance(v, str),
    "tensor": lambda v: isinstance(v, dict),
}


def validate_inputs(spec: ModelSpec, inputs: Any) -> dict[str, Any]:
    if not isinstance(inputs, dict):
        raise RequestError(INVALID_INPUT, "'inputs' must be a map")
    declared = {i["name"]: i for i in spec.inputs}
    for name, value in inputs.items():
        decl = declared.get(name)
        if decl is None:
            raise RequestError(INVALID_INPUT, f"model '{spec.name}' has no input {name!r}; "
                                              f"it takes {', '.join(declared)}")
        if not _KIND_CHECKS[decl["kind"]](value):
            raise RequestError(INVALID_INPUT, f"input '{name}' must be of kind {decl['kind']}, "
                                              f"got {type(value).__name__}")
        if isinstance(value, float) and math.isinf(value):
            raise RequestError(INVALID_INPUT, f"input '{name}' is infinite")
    for name, decl in declared.items():
        if not decl.get("optional", False) and name not in inputs:
            raise RequestError(INVALID_INPUT, f"missing input '{name}'")
    return inputs


def precheck(spec: ModelSpec, inputs: Any) -> None:
    """``RequestError`` (INVALID_INPUT) for inputs that the version's preprocessing would refuse whatever
    its state: ``validate_inputs``, then, for tensor preprocessing, each tensor map's header."""
    validate_inputs(spec, inputs)
    if (spec.preprocess or {}).get("type") == "tensor":
        for decl in spec.inputs:
            if decl["name"] in inputs:
                decode_tensor(inputs[decl["name"]], f"input '{decl['name']}'")


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG or JPEG header, or None when not recognised."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    if data[:2] == b"\xff\xd8":
        pos = 2
        n = len(data)
        while pos + 4 <= n:
            if data[pos] != 0xFF:
                return None
            marker = data[pos + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                pos += 2
                continue
            seglen = struct.unpack(">H", data[pos + 2:pos + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                if pos + 9 > n:
                    return None
                h, w = struct.unpack(">HH", data[pos + 5:pos + 9])
                return w, h
            pos += 2 + seglen
    return None


def image_pixels(spec: ModelSpec, inputs: Any) -> int | None:
    """An image version's request: the pixels its image's PNG/JPEG header declares (0: no such header,
    or no image); None for a version of another kind.  O(header), no decoding."""
    pre = spec.preprocess or {}
    if pre.get("type") != "image":
        return None
    data = inputs.get(pre.get("input", DEFAULT_IMAGE_INPUT)) if isinstance(inputs, dict) else None
    size = image_size(data) if isinstance(data, (bytes, bytearray)) else None
    return 0 if size is None else size[0] * size[1]
