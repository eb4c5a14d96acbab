"""``aieng bench --model ocr``: the ``ocr`` pipeline beside rapidocr's own one-process pipeline, in one run.

The same page images (drawn here: lines of words in OpenCV's fonts at several sizes, a table grid, a
slight rotation; PNG) go through:

1. rapidocr (``RapidOCR`` on the ONNX files the server serves, ``use_cls`` off as the server has no
   classifier), one page at a time in this process, as a user would run it; ONNX Runtime uses every
   core while it runs.  Its own time per step (``elapse_list``: det, cls, rec) is reported.  rapidocr is
   imported only inside ``reference`` and only when installed (it is a test dependency); without it the
   reference rows are left out.  It runs before and after the server, so drift of a shared machine shows.
2. The aieng server (a subprocess serving ``textdet,textrec,ocr``), closed loop at each concurrency:
   pages per second, p50/p95 latency, and the mean of each step of ``timing_us`` (textdet, crop,
   textrec, join) and of the crop batch size.

Targets (issue 13): throughput at saturation >= 1.1 x rapidocr's, concurrency-1 latency within 10% of
rapidocr's.  Writes ``<out>/ocr.md``.  Speed targets live here, never in tests.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import numpy as np

STEPS = ("textdet", "crop", "textrec", "join")
WORDS = ("invoice total amount shipping order number customer address payment date reference quantity "
         "price describe service support account balance").split()


def pages(n_distinct: int = 6, seed: int = 0) -> list[bytes]:
    """Distinct PNG pages of about 30 text lines each (900 x 1200, rotated by up to 1.5 degrees)."""
    import cv2

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_distinct):
        img = np.full((1200, 900, 3), 255, np.uint8)
        y = 60
        for size in (1.1, 0.8, 0.7, 0.6):
            for _ in range(6 if size < 1 else 1):
                text = " ".join(rng.choice(WORDS, int(rng.integers(2, 7))))
                cv2.putText(img, text, (60, y), cv2.FONT_HERSHEY_SIMPLEX, size, (0, 0, 0),
                            2 if size >= 0.8 else 1, cv2.LINE_AA)
                y += int(44 * size) + 10
            y += 20
        top = y + 20
        for r in range(6):
            for c in range(4):
                cv2.putText(img, f"{rng.choice(WORDS)} {r}{c}", (70 + c * 190, top + r * 40 + 27),
                            cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
        for r in range(7):
            cv2.line(img, (60, top + r * 40), (820, top + r * 40), (0, 0, 0), 2)
        angle = float(rng.uniform(-1.5, 1.5)) if k % 2 else 0.0
        m = cv2.getRotationMatrix2D((450, 600), angle, 1.0)
        img = cv2.warpAffine(img, m, (900, 1200), borderValue=(255, 255, 255))
        out.append(cv2.imencode(".png", img)[1].tobytes())
    return out


def reference(repo: str, images: list[bytes], n: int) -> dict[str, Any] | None:
    """rapidocr's own pipeline on ``n`` pages, one at a time: pages/s, latency, time per step."""
    try:
        from rapidocr import RapidOCR
    except ImportError:
        return None
    import cv2

    engine = RapidOCR(params={"Global.use_cls": False, "Global.log_level": "warning",
                              "Det.model_path": os.path.join(repo, "textdet", "1", "model.onnx"),
                              "Rec.model_path": os.path.join(repo, "textrec", "1", "model.onnx")})
    decoded = [cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR) for b in images]
    engine(decoded[0])  # warm-up
    lat, det, rec = [], [], []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        res = engine(cv2.imdecode(np.frombuffer(images[i % len(images)], np.uint8), cv2.IMREAD_COLOR))
        lat.append(time.perf_counter() - t)
        det.append(res.elapse_list[0] or 0.0)
        rec.append(res.elapse_list[2] or 0.0)
    wall = time.perf_counter() - t0
    return {"rate": n / wall, "p50": statistics.median(lat), "mean": statistics.fmean(lat),
            "det": statistics.fmean(det), "rec": statistics.fmean(rec)}


async def _closed(addr: str, images: list[bytes], c: int, n: int) -> dict[str, Any]:
    from aieng.client import AsyncClient

    client = AsyncClient(addr, timeout_s=120)
    lat: list[float] = []
    steps: dict[str, list[int]] = {s: [] for s in STEPS}
    batch: list[float] = []
    errors: dict[str, int] = {}
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            t = time.perf_counter()
            r = await client.infer("ocr", {"image": images[i % len(images)]}, raise_on_error=False)
            if not r.get("ok"):
                errors[r["error"]["code"]] = errors.get(r["error"]["code"], 0) + 1
                continue
            lat.append(time.perf_counter() - t)
            for s in STEPS:
                steps[s].append(r["timing_us"][s])
            batch.append(r.get("crop_batch_mean", 0.0))

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - t0
    finally:
        client.close()
    return {"c": c, "rate": len(lat) / wall, "p50": float(np.percentile(lat, 50)) if lat else None,
            "p95": float(np.percentile(lat, 95)) if lat else None, "errors": errors,
            "steps": {s: statistics.fmean(v) / 1e6 if v else 0.0 for s, v in steps.items()},
            "batch": statistics.fmean(batch) if batch else 0.0}


def server(repo: str, images: list[bytes], levels: list[int], n: int) -> list[dict]:
    from aieng.bench import _start_server, _stop

    proc, addr, _ = _start_server("textdet,textrec,ocr", repo)
    try:
        out = []
        for c in levels:
            asyncio.run(_closed(addr, images, c, min(n, 2 * c)))  # warm this level
            out.append(asyncio.run(_closed(addr, images, c, n)))
            print(f"server c={c}: {out[-1]['rate']:.2f} pages/s", flush=True)
        return out
    finally:
        _stop(proc)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def fmt(ref: list[dict | None], srv: list[dict], n: int) -> str:
    refs = [r for r in ref if r is not None]
    lines = [f"# aieng bench --model ocr ({n} pages per row)", ""]
    if refs:
        lines += ["rapidocr's own pipeline (one process, one page at a time, use_cls off; before and after):",
                  "",
                  "| run | pages/s | p50 ms | mean ms | det ms | rec ms |", "|---|---|---|---|---|---|"]
        for name, r in zip(("before", "after"), ref):
            if r is not None:
                lines.append(f"| {name} | {r['rate']:.2f} | {_ms(r['p50'])} | {_ms(r['mean'])} | "
                             f"{_ms(r['det'])} | {_ms(r['rec'])} |")
    else:
        lines += ["rapidocr is not installed (pip install rapidocr): no reference rows."]
    best = max((r["rate"] for r in refs), default=None)
    lat1 = min((r["p50"] for r in refs), default=None)
    lines += ["", "aieng server (textdet,textrec,ocr), closed loop; step columns are means of timing_us:", "",
              "| concurrency | pages/s | x rapidocr | p50 ms | p95 ms | textdet ms | crop ms (sum) "
              "| textrec ms | join ms | crop batch | errors |", "|---" * 11 + "|"]
    for r in srv:
        x = f"{r['rate'] / best:.2f}" if best else "-"
        s = r["steps"]
        lines.append(f"| {r['c']} | {r['rate']:.2f} | {x} | {_ms(r['p50'])} | {_ms(r['p95'])} | "
                     f"{_ms(s['textdet'])} | {_ms(s['crop'])} | {_ms(s['textrec'])} | "
                     f"{s['join'] * 1e3:.2f} | {r['batch']:.2f} | {r['errors'] or ''} |")
    if best and srv:
        top = max(r["rate"] for r in srv)
        one = next((r for r in srv if r["c"] == 1), None)
        lines += ["", f"Throughput at saturation: {top / best:.2f} x rapidocr (target >= 1.1)."]
        if one is not None and one["p50"] and lat1:
            lines.append(f"Concurrency-1 p50 latency: {one['p50'] / lat1:.2f} x rapidocr's (target <= 1.10).")
    return "\n".join(lines) + "\n"


def main_ocr(args) -> int:
    from aieng.config import load_config

    repo = load_config().model_repository
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    n = min(args.requests, 12) if args.quick else min(args.requests, 40)
    images = pages()
    print(f"bench ocr: {len(images)} pages, levels {levels}, {n} pages per row", flush=True)
    before = reference(repo, images, n)
    srv = server(repo, images, levels, n)
    after = reference(repo, images, n)
    text = fmt([before, after], srv, n)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "ocr.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    print(f"wrote {path}")
    return 0
