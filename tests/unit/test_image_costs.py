"""What an image costs beyond its pixels, read before decoding: ``inputs.jpeg_scans`` (a JPEG's scans counted
as libjpeg meets them, and the image processor's refusal), and ``inputs.direct_image_pixels`` keeping PNGs off
the executor's idle route."""
from __future__ import annotations

import pytest

from aieng.inputs import jpeg_scans
from aieng.models.image_config import MAX_SCANS
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
    from aieng.processing.pre.image import ImagePreprocessor
    from aieng.wire.protocol import INVALID_INPUT, RequestError
    from tests.unit.demo import spec

    proc = ImagePreprocessor(spec("orientation"))
    with pytest.raises(RequestError) as err:
        proc.decode(scan_bomb())
    assert (err.value.code, err.value.message) == (
        INVALID_INPUT, f"input 'image' is a JPEG of more than {MAX_SCANS} scans (max_scans): "
                       "each scan is a decoding pass of its own")
    assert proc.decode(progressive_jpeg(300)).shape == (300, 300, 3)



def test_the_direct_route_weighs_a_jpeg_by_its_pixels_and_never_takes_a_png():
    import cv2
    import numpy as np

    from aieng.inputs import direct_image_pixels, image_pixels
    from tests.hostile_images import png_inflate_bomb
    from tests.unit.demo import spec

    orientation, img = spec("orientation"), np.zeros((30, 40, 3), np.uint8)
    jpeg, png = cv2.imencode(".jpg", img)[1].tobytes(), cv2.imencode(".png", img)[1].tobytes()
    assert direct_image_pixels(orientation, {"image": jpeg}) == 1200
    assert (direct_image_pixels(orientation, {"image": png}), image_pixels(orientation, {"image": png})) == (
        0, 1200)
    assert direct_image_pixels(orientation, {"image": png_inflate_bomb(100, 0.01)}) == 0
    assert direct_image_pixels(orientation, {"image": b"neither"}) == 0
    assert direct_image_pixels(spec("tabular"), {"island": "Biscoe"}) is None
