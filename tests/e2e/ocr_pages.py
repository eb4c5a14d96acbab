"""E2E helpers for OCR: synthetic text pages, their PNG bytes, calling a model on many, box overlap."""
from __future__ import annotations

import asyncio
import os
import subprocess

import cv2
import numpy as np
from shapely.geometry import Polygon

from aieng.client import AsyncClient

WORDS = ("invoice total amount shipping order number customer address payment date reference "
         "quantity price describe service support account balance").split()


def fonts() -> list[str]:
    """TrueType fonts on this machine (fc-list), a few of them; [] when there are none."""
    try:
        out = subprocess.run(["fc-list", ":fontformat=TrueType", "file"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    files = sorted({line.split(":")[0].strip() for line in out.splitlines()})
    files = [f for f in files if f.endswith(".ttf") and os.path.isfile(f)]
    return [f for f in files if "Sans" in f or "Serif" in f][:4] or files[:4]


def sentence(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def draw_text(img: np.ndarray, xy: tuple[int, int], text: str, size: int, font: str | None) -> None:
    """Black text at xy (top-left): with a TrueType font through PIL, else OpenCV's Hershey font."""
    if font is None:
        scale = size / 30.0
        cv2.putText(img, text, (xy[0], xy[1] + size), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0),
                    max(1, int(round(scale * 2))), cv2.LINE_AA)
        return
    from PIL import Image, ImageDraw, ImageFont

    pil = Image.fromarray(img)
    ImageDraw.Draw(pil).text(xy, text, fill=(0, 0, 0), font=ImageFont.truetype(font, size))
    img[:] = np.asarray(pil)


def make_page(seed: int, width: int = 900, height: int = 1200, angle: float = 0.0) -> np.ndarray:
    """A BGR page: a title, paragraphs in two sizes, a table (grid and text), a figure (shapes)."""
    rng = np.random.default_rng(seed)
    fl = fonts() + [None]
    font = fl[seed % len(fl)]
    img = np.full((height, width, 3), 255, np.uint8)
    draw_text(img, (60, 50), sentence(rng, 3).title(), 38, font)
    y = 130
    for size in (22, 18):
        for _ in range(4):
            draw_text(img, (60, y), sentence(rng, 7), size, font)
            y += int(size * 1.6)
        y += 20
    top, rows, cols, cw, rh = y + 20, 5, 4, (width - 140) // 4, 40
    for r in range(rows + 1):
        cv2.line(img, (60, top + r * rh), (60 + cols * cw, top + r * rh), (0, 0, 0), 2)
    for c in range(cols + 1):
        cv2.line(img, (60 + c * cw, top), (60 + c * cw, top + rows * rh), (0, 0, 0), 2)
    for r in range(rows):
        for c in range(cols):
            draw_text(img, (70 + c * cw, top + r * rh + 10), f"{rng.choice(WORDS)} {r}{c}", 16, font)
    fig = top + rows * rh + 50
    fh = min(320, height - fig - 30)  # the figure: an outlined circle, a filled block, a line
    if fh > 120:
        cv2.circle(img, (60 + fh // 2, fig + fh // 2), fh // 2 - 5, (200, 60, 20), 5)
        cv2.rectangle(img, (100 + fh, fig + 10), (100 + 2 * fh, fig + fh - 10), (40, 40, 220), -1)
        cv2.line(img, (140 + 2 * fh, fig + fh), (min(width - 40, 140 + 3 * fh), fig), (30, 150, 30), 6)
    if angle:
        m = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
        img = cv2.warpAffine(img, m, (width, height), borderValue=(255, 255, 255))
    return img


PAGES = [(0, 900, 1200, 0.0), (1, 1000, 1300, 1.5), (2, 850, 1100, -2.0), (3, 1200, 900, 1.0)]


def png(img: np.ndarray) -> bytes:
    return cv2.imencode(".png", img)[1].tobytes()


def call_all(addr: str, model: str, images: list[bytes], raise_on_error: bool = True) -> list[dict]:
    """Every image in flight at once (so the executor can batch them); replies in input order."""
    async def run():
        client = AsyncClient(addr, timeout_s=120)
        try:
            return await asyncio.gather(*(client.infer(model, {"image": im}, raise_on_error=raise_on_error)
                                          for im in images))
        finally:
            client.close()

    return asyncio.run(run())


def quad_iou(a, b) -> float:
    pa, pb = Polygon(np.asarray(a).reshape(4, 2)), Polygon(np.asarray(b).reshape(4, 2))
    union = pa.union(pb).area
    return pa.intersection(pb).area / union if union > 0 else 0.0
