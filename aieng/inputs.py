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
what the frontend's direct route weighs an image request by), without OpenCV.  ``jpeg_scans`` counts a
JPEG's scans the way libjpeg meets them: each scan is a full pass over the image's blocks however few
bytes it has (measured: an empty 10-byte scan costs 67 us at 1000x1000, so 2 MB of them held a decoder
for 12 s), so the image processor refuses more than its ``max_scans`` before decoding.
``direct_image_pixels`` is ``image_pixels`` as the executor's idle route weighs a request: never a PNG.
"""
from __future__ import annotations

import math
import re
import struct
from typing import Any

from aieng.models.repo import ModelSpec
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
    declared = spec.inputs_by_name
    for name, value in inputs.items():
        decl = declared.get(name)
        if decl is None:
            raise RequestError(INVALID_INPUT, f"model '{spec.name}' has no input {name!r}; "
                                              f"it takes {', '.join(declared)}")
        if not _KIND_CHECKS[decl.kind](value):
            raise RequestError(INVALID_INPUT, f"input '{name}' must be of kind {decl.kind}, "
                                              f"got {type(value).__name__}")
        if isinstance(value, float) and math.isinf(value):
            raise RequestError(INVALID_INPUT, f"input '{name}' is infinite")
    for name, decl in declared.items():
        if not decl.optional and name not in inputs:
            raise RequestError(INVALID_INPUT, f"missing input '{name}'")
    return inputs


def precheck(spec: ModelSpec, inputs: Any) -> None:
    """``RequestError`` (INVALID_INPUT) for inputs that the version's preprocessing would refuse whatever
    its state: ``validate_inputs``, then, for tensor (and python) preprocessing, each tensor map's header."""
    validate_inputs(spec, inputs)
    if spec.preprocess.type in ("tensor", "python"):  # a hook gets a declared tensor input as its array
        for decl in spec.inputs:
            if decl.name in inputs:
                decode_tensor(inputs[decl.name], f"input '{decl.name}'")


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
    pre = spec.preprocess
    if pre.type != "image":
        return None
    data = inputs.get(pre.input) if isinstance(inputs, dict) else None
    size = image_size(data) if isinstance(data, (bytes, bytearray)) else None
    return 0 if size is None else size[0] * size[1]


def direct_image_pixels(spec: ModelSpec, inputs: Any) -> int | None:
    """``image_pixels`` as the executor's direct route weighs a request (``frontend/requests/pipeline``):
    0, the pool's, for a PNG.  Its zlib stream may run on past its rows and libpng inflates the excess
    (a 3.7 MB 1000x1000 PNG within the route's byte bound: 4 s of ``cv2.imdecode``); only an inflate of
    the rows would find it, 80% of a decode (18 of 22.6 ms at 1000x1000), where the pool's hand-off costs
    a fraction of a millisecond.  A JPEG's cost is bounded by its pixels and ``max_scans``."""
    pixels = image_pixels(spec, inputs)
    if pixels:
        data = inputs.get(spec.preprocess.input)
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            return 0
    return pixels


# A marker inside a scan's entropy-coded data: 0xFF followed by neither a stuffed 0x00, nor a fill 0xFF
# (the marker is the byte after the last one), nor RST0-7 (restart markers stay inside their scan).  One
# byte after the 0xFF, so a run of 0xFF00 pairs costs the regex engine a linear pass, never a backtrack.
_SCAN_END = re.compile(rb"\xff[^\x00\xff\xd0-\xd7]")
_ANY_MARKER = re.compile(rb"\xff[^\x00\xff]")  # libjpeg's next_marker: skips garbage up to the next one
_STANDALONE = {0x01, 0xD8} | set(range(0xD0, 0xD8))  # markers without a length field
SOS, EOI = 0xDA, 0xD9


def jpeg_scans(data: bytes, stop_after: int) -> int:
    """The scans (SOS segments) of a JPEG, counted up to ``stop_after + 1`` (then it stops reading): 0 for
    data that is not a JPEG.  Walks the marker segments by their lengths and skips each scan's entropy-
    coded data to the marker that ends it, as libjpeg does, so no scan it would decode goes uncounted.
    O(bytes) in the ``re`` engine's C loop, no Python per byte: about 1 ms per MB here."""
    if data[:2] != b"\xff\xd8":
        return 0
    n, pos, scans = len(data), 2, 0
    while pos + 1 < n:
        if data[pos] != 0xFF or data[pos + 1] in (0x00, 0xFF):  # garbage or fill: libjpeg skips to a marker
            found = _ANY_MARKER.search(data, pos)
            if found is None:
                return scans
            pos = found.start()
        marker = data[pos + 1]
        if marker == EOI:
            return scans
        if marker in _STANDALONE:
            pos += 2
            continue
        if pos + 4 > n:
            return scans
        pos += 2 + struct.unpack(">H", data[pos + 2:pos + 4])[0]
        if marker == SOS:
            scans += 1
            if scans > stop_after:
                return scans
            found = _SCAN_END.search(data, pos)
            if found is None:
                return scans
            pos = found.start()
    return scans
