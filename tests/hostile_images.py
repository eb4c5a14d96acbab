"""Images that are valid by their header and limits but cost a decoder far more than their pixels say.

``scan_bomb``: a real progressive JPEG (OpenCV's encoder) with ``scans`` empty copies of its last scan header
inserted before EOI.  libjpeg makes a pass over every block for each scan however empty it is, so 189,494 of
them in 2 MB held ``cv2.imdecode`` for 12 s at 1000 x 1000 here; the header and pixel count stay valid.
``png_inflate_bomb``: a PNG whose zlib stream runs on past its rows (libpng inflates the excess: 4 s).
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


def png_inflate_bomb(side: int = 1000, extra_gb: float = 3.5) -> bytes:
    """A ``side`` x ``side`` RGB PNG of zeros whose zlib stream goes on for ``extra_gb`` GB more zeros than
    its rows: libpng inflates the excess before it drops it (about 1 s per GB here).  Built from one repeated
    sync-flushed deflate segment (the same bytes each time: the window holds only zeros), with the right
    Adler-32, so it costs the test milliseconds to make."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows, piece = side * (1 + 3 * side), 10 << 20
    co = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the zlib header and trailer are ours
    first = co.compress(bytes(rows)) + co.flush(zlib.Z_SYNC_FLUSH)
    repeat = co.compress(bytes(piece)) + co.flush(zlib.Z_SYNC_FLUSH)
    assert co.compress(bytes(piece)) + co.flush(zlib.Z_SYNC_FLUSH) == repeat
    count = int(extra_gb * (1 << 30)) // piece
    total = rows + count * piece  # all zeros: Adler-32's A stays 1 and B is the length
    body = b"\x78\xda" + first + repeat * count + b"\x03\x00" + struct.pack(">I", (total % 65521) << 16 | 1)
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
