"""E2E inputs shared by the text and image model tests: the text mix and rendered document pages."""
from __future__ import annotations

import cv2
import reference  # noqa: E402

TEXTS = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog.",
    "Zero-copy shared memory keeps tensors out of the socket.",
    "ok",
    "naïve café résumé — unicode 東京 👍",
    " ".join(["a long input that will be truncated at one hundred and twenty eight tokens"] * 30),
]


def _documents():
    out = []
    for i, (w, h) in enumerate([(800, 1100), (640, 900), (1000, 700)]):
        page = reference.make_document_image(width=w, height=h, seed=i)
        for rot in (None, cv2.ROTATE_90_CLOCKWISE, cv2.ROTATE_180, cv2.ROTATE_90_COUNTERCLOCKWISE):
            img = page if rot is None else cv2.rotate(page, rot)
            ext = ".png" if i % 2 == 0 else ".jpg"
            out.append(cv2.imencode(ext, img)[1].tobytes())
    return out
