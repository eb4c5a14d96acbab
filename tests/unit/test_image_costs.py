"""What an image costs beyond its pixels, read before decoding: ``inputs.jpeg_scans`` (a JPEG's scans counted
as libjpeg meets them, and the image processor's refusal) and ``inputs.png_overlong`` (more compressed data
than a PNG's rows)."""
from __future__ import annotations

import pytest

from aieng.inputs import jpeg_scans
from aieng.preprocess_workers.image_config import MAX_SCANS
from tests.hostile_images import last_scan_header, progressive_jpeg, scan_bomb

SOI, EOI = b"\xff\xd8", b"\xff\xd9"
SOS = b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00"  # one component, spectral 0..63: a baseline scan header


def test_a_real_progressive_jpeg_has_its_encoders_scans():
    assert jpeg_scans(progressive_jpeg(200), 1000) == 10  # libjpeg's standard progressive script


def test_inserted_empty_scans_are_each_counted():
    base = progressive_jpeg(200)
    extra = last_scan_header(base) * 25
    assert jpeg_scans(base[:-2] + extra + base[-2:], 1000) == 35


def test_counting_stops_one_past_the_limit():
    assert jpeg_scans(scan_bomb(200_000, 200), 64) == 65


def test_stuffed_ff00_and_restart_markers_stay_inside_their_scan():
    entropy = b"\x12\xff\x00\x34\xff\xd0\x56\xff\xd7\xff\xff\x00\x78"
    assert jpeg_scans(SOI + SOS + entropy + SOS + entropy + EOI, 100) == 2


def test_a_marker_after_fill_bytes_ends_the_scan():
    assert jpeg_scans(SOI + SOS + b"\x01\xff\xff\xff" + SOS[1:] + b"\x02" + EOI, 100) == 2


def test_nothing_after_eoi_counts():
    assert jpeg_scans(SOI + SOS + b"\x01" + EOI + SOS * 5, 100) == 1


def test_garbage_between_segments_is_skipped_to_the_next_marker_as_libjpeg_does():
    assert jpeg_scans(SOI + b"junk\x00\xff\x00" + SOS + b"\x01" + EOI, 100) == 1


@pytest.mark.parametrize("data", [b"", b"\x89PNG\r\n\x1a\n", SOI, SOI + b"\xff", SOI + SOS[:3], SOI + SOS])
def test_short_or_foreign_data_is_read_without_error(data):
    assert jpeg_scans(data, 100) <= 1


def test_the_image_processor_refuses_a_scan_bomb_before_decoding():
    from aieng.preprocess_workers.image import ImagePreprocessor
    from aieng.wire.protocol import INVALID_INPUT, RequestError
    from tests.unit.demo import spec

    proc = ImagePreprocessor(spec("orientation"))
    with pytest.raises(RequestError) as err:
        proc.decode(scan_bomb())
    assert (err.value.code, err.value.message) == (
        INVALID_INPUT, f"input 'image' is a JPEG of more than {MAX_SCANS} scans (max_scans): "
                       "each scan is a decoding pass of its own")
    assert proc.decode(progressive_jpeg(300)).shape == (300, 300, 3)


def png(w: int, h: int, extra: int = 0, interlace: int = 0, colour: int = 2) -> bytes:
    """A PNG of ``w`` x ``h`` (8-bit), its zlib stream holding ``extra`` more zero bytes than its rows."""
    import struct
    import zlib

    from aieng.inputs import png_row_bytes

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, interlace)
    need = png_row_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr))
    z = zlib.compress(bytes(need + extra))
    half = len(z) // 2  # in two IDAT chunks, as encoders split them
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", z[:half]) + chunk(b"IDAT", z[half:])
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("w,h,interlace,colour",
                         [(100, 60, 0, 2), (33, 17, 1, 6), (7, 5, 1, 0), (1, 1, 0, 4)])
def test_png_row_bytes_match_what_opencv_reads(w, h, interlace, colour):
    import cv2
    import numpy as np

    from aieng.inputs import png_overlong

    data = png(w, h, interlace=interlace, colour=colour)
    assert not png_overlong(data)
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2] == (h, w)
    assert png_overlong(png(w, h, extra=1, interlace=interlace, colour=colour))


def test_a_real_png_is_not_overlong_and_a_padded_one_is():
    import cv2
    import numpy as np

    from aieng.inputs import png_overlong

    img = np.random.default_rng(1).integers(0, 256, (120, 90, 3), dtype=np.uint8)
    assert not png_overlong(cv2.imencode(".png", img)[1].tobytes())
    assert png_overlong(png(90, 120, extra=50_000_000))
    assert not png_overlong(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # unreadable: the decoder's to judge


def test_only_a_strict_processor_refuses_an_overlong_png():
    from aieng.preprocess_workers.image import ImagePreprocessor
    from aieng.wire.protocol import INVALID_INPUT, RequestError
    from tests.unit.demo import spec

    proc, data = ImagePreprocessor(spec("orientation")), png(90, 120, extra=1000)
    assert proc.decode(data).shape == (120, 90, 3)  # the pool's: libpng inflates and drops the excess
    proc.strict_png = True  # the executor's
    with pytest.raises(RequestError) as err:
        proc.decode(data)
    assert (err.value.code, err.value.message) == (
        INVALID_INPUT, "input 'image' is a PNG whose image data inflates to more than its 90x120 pixels' "
                       "rows")
