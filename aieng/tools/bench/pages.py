"""What ``aieng bench --model ocr`` and ``--model layout`` share: a page model beside its package's pipeline.

* ``pages``: distinct PNG pages drawn here (lines of words, a table grid, for layout a figure; every
  other page slightly rotated), so the bench needs no data files.
* ``reference``: the package's pipeline through ``call(bgr) -> {step: seconds}``, ``n`` pages in a row
  after a warm-up, with latency and this process's CPU per page; run before and after the server.
* ``server``: a server subprocess (``bench.kit.start_server``), a closed loop per concurrency level;
  ``steps_of(reply)`` reads the server's own timing of each answer (``timing_us``).
* ``fmt``: one markdown report with the reference rows, the server rows and the two target ratios of
  issue 13.

What each row measures: BENCHMARKS.md, 'What `aieng bench` reports'.  Speed targets live here, never
in tests.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

WORDS = ("invoice total amount shipping order number customer address payment date reference quantity "
         "price describe service support account balance").split()
StepsOf = Callable[[dict], "tuple[dict[str, float], float | None]"]


def pages(n_distinct: int = 6, seed: int = 0, figure: bool = False) -> list[bytes]:
    """Distinct PNG pages of about 30 text lines each (900 x 1200, rotated by up to 1.5 degrees); with
    ``figure`` six lines fewer and a drawing (circle, filled block, line) under the table, so a layout
    model sees one."""
    import cv2

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_distinct):
        img = np.full((1200, 900, 3), 255, np.uint8)
        y = 60
        for size in (1.1, 0.8, 0.7) if figure else (1.1, 0.8, 0.7, 0.6):  # room for the figure
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
        fig = top + 6 * 40 + 40
        if figure and 1200 - fig > 150:
            fh = 1200 - fig - 40
            cv2.circle(img, (60 + fh // 2, fig + fh // 2), fh // 2 - 5, (200, 60, 20), 5)
            cv2.rectangle(img, (100 + fh, fig + 10), (100 + 2 * fh, fig + fh - 10), (40, 40, 220), -1)
            cv2.line(img, (140 + 2 * fh, fig + fh), (min(860, 140 + 3 * fh), fig), (30, 150, 30), 6)
        angle = float(rng.uniform(-1.5, 1.5)) if k % 2 else 0.0
        m = cv2.getRotationMatrix2D((450, 600), angle, 1.0)
        img = cv2.warpAffine(img, m, (900, 1200), borderValue=(255, 255, 255))
        out.append(cv2.imencode(".png", img)[1].tobytes())
    return out


def reference(call: Callable[[np.ndarray], dict[str, float]], images: list[bytes], n: int) -> dict[str, Any]:
    """``n`` pages through ``call`` one at a time: pages/s, p50 and mean latency, mean time per step."""
    import cv2

    call(cv2.imdecode(np.frombuffer(images[0], np.uint8), cv2.IMREAD_COLOR))  # warm-up
    lat: list[float] = []
    steps: dict[str, list[float]] = {}
    t0, cpu0 = time.perf_counter(), time.process_time()  # this process: the package's threads too
    for i in range(n):
        t = time.perf_counter()
        got = call(cv2.imdecode(np.frombuffer(images[i % len(images)], np.uint8), cv2.IMREAD_COLOR))
        lat.append(time.perf_counter() - t)
        for k, v in got.items():
            steps.setdefault(k, []).append(v)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"rate": n / wall, "p50": statistics.median(lat), "mean": statistics.fmean(lat),
            "steps": {k: statistics.fmean(v) for k, v in steps.items()}, "cpu": cpu / n}


async def closed(addr: str, model: str, images: list[bytes], c: int, n: int, steps_of: StepsOf) -> dict:
    """``c`` clients in a closed loop until ``n`` pages were sent: rate, p50/p95, step means, batch mean."""
    from aieng.client import AsyncClient

    client = AsyncClient(addr, timeout_s=120)
    lat: list[float] = []
    steps: dict[str, list[float]] = {}
    batch: list[float] = []
    errors: dict[str, int] = {}
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            t = time.perf_counter()
            r = await client.infer(model, {"image": images[i % len(images)]}, raise_on_error=False)
            if not r.get("ok"):
                errors[r["error"]["code"]] = errors.get(r["error"]["code"], 0) + 1
                continue
            lat.append(time.perf_counter() - t)
            got, b = steps_of(r)
            for k, v in got.items():
                steps.setdefault(k, []).append(v)
            if b is not None:
                batch.append(b)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - t0
    finally:
        client.close()
    return {"c": c, "rate": len(lat) / wall, "p50": float(np.percentile(lat, 50)) if lat else None,
            "p95": float(np.percentile(lat, 95)) if lat else None, "errors": errors,
            "steps": {k: statistics.fmean(v) for k, v in steps.items()},
            "batch": statistics.fmean(batch) if batch else None}


def server(serve: str, model: str, repo: str, images: list[bytes], levels: list[int], n: int,
           steps_of: StepsOf) -> list[dict]:
    """A server serving ``serve``; at each level a warm-up of ``2c`` pages, then ``n`` measured, with the
    CPU seconds per answered page of every server process (``cpuacct``; the figure a noisy shared machine
    moves least)."""
    from aieng.runtime import cpuacct
    from aieng.tools.bench.kit import start_server, stop_server

    proc, addr, _ = start_server(serve, repo)
    try:
        out = []
        for c in levels:
            asyncio.run(closed(addr, model, images, c, min(n, 2 * c), steps_of))  # warm this level
            before = cpuacct.snapshot(proc.pid)
            r = asyncio.run(closed(addr, model, images, c, n, steps_of))
            used = cpuacct.delta(before, cpuacct.snapshot(proc.pid))
            done = max(1, n - sum(r["errors"].values()))
            r["cpu"] = {k: v / done for k, v in used.items()}
            r["cpu"]["total"] = sum(used.values()) / done
            out.append(r)
            print(f"server c={c}: {r['rate']:.2f} pages/s, {r['cpu']['total']:.2f} CPU s/page", flush=True)
        return out
    finally:
        stop_server(proc)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}" if x >= 0.0095 else f"{x * 1000:.2f}"


@dataclass
class Report:
    """What one page bench names in its report."""
    model: str  # the model benched
    serve: str  # the models the server serves
    ref_name: str  # the package
    ref_note: str  # how the package ran
    ref_steps: tuple[str, ...]  # step keys of the reference rows (column "<key> ms")
    steps: tuple[str, ...]  # step keys of the server rows
    steps_note: str  # what the server's step columns are
    batch_name: str = "batch"


def fmt(rep: Report, ref: list[dict | None], srv: list[dict], n: int) -> str:
    refs = [r for r in ref if r is not None]
    lines = [f"# aieng bench --model {rep.model} ({n} pages per row)", ""]
    if refs:
        lines += [f"{rep.ref_name}'s own pipeline ({rep.ref_note}; before and after):", "",
                  "| run | pages/s | p50 ms | mean ms | "
                  + " | ".join(f"{s} ms" for s in rep.ref_steps) + " | CPU s/page |",
                  "|---" * (5 + len(rep.ref_steps)) + "|"]
        for name, r in zip(("before", "after"), ref):
            if r is not None:
                lines.append(f"| {name} | {r['rate']:.2f} | {_ms(r['p50'])} | {_ms(r['mean'])} | "
                             + " | ".join(_ms(r["steps"].get(s)) for s in rep.ref_steps)
                             + f" | {r['cpu']:.2f} |")
    else:
        lines += [f"{rep.ref_name} is not available: no reference rows."]
    best = max((r["rate"] for r in refs), default=None)
    lat1 = min((r["p50"] for r in refs), default=None)
    lines += ["", f"aieng server ({rep.serve}), closed loop; {rep.steps_note}:", "",
              f"| concurrency | pages/s | x {rep.ref_name} | p50 ms | p95 ms | "
              + " | ".join(f"{s} ms" for s in rep.steps) + f" | {rep.batch_name} | CPU s/page (executor) "
              "| errors |", "|---" * (8 + len(rep.steps)) + "|"]
    for r in srv:
        x = f"{r['rate'] / best:.2f}" if best else "-"
        b = "-" if r["batch"] is None else f"{r['batch']:.2f}"
        cpu = r.get("cpu", {})
        lines.append(f"| {r['c']} | {r['rate']:.2f} | {x} | {_ms(r['p50'])} | {_ms(r['p95'])} | "
                     + " | ".join(_ms(r["steps"].get(s)) for s in rep.steps)
                     + f" | {b} | {cpu.get('total', 0):.2f} ({cpu.get('executor', 0):.2f}) "
                     f"| {r['errors'] or ''} |")

    if best and srv:
        top = max(srv, key=lambda r: r["rate"])
        one = next((r for r in srv if r["c"] == 1), None)
        lines += ["", f"Throughput at saturation: {top['rate'] / best:.2f} x {rep.ref_name} "
                      f"(best level c={top['c']}; target >= 1.1)."]
        if one is not None and one["p50"] and lat1:
            lines.append(f"Concurrency-1 p50 latency: {one['p50'] / lat1:.2f} x {rep.ref_name}'s "
                         "(target <= 1.10).")
    return "\n".join(lines) + "\n"


def run(args, rep: Report, images: list[bytes], make_ref: Callable[[str], Any], steps_of: StepsOf) -> int:
    """The bench: reference, server at each level, reference again; writes ``<out>/<model>.md``.
    ``make_ref(repo)`` returns the reference's ``call`` (its ``note``, if any, goes into the report) or None
    when the package is missing."""
    from aieng.config import load_config
    from aieng.tools.bench.kit import write_report

    repo = load_config().model_repository
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    n = min(args.requests, 12) if args.quick else min(args.requests, 40)
    print(f"bench {rep.model}: {len(images)} pages, levels {levels}, {n} pages per row, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    call = make_ref(repo)
    before = reference(call, images, n) if call is not None else None
    srv = server(rep.serve, rep.model, repo, images, levels, n, steps_of)
    after = reference(call, images, n) if call is not None else None
    text = fmt(rep, [before, after], srv, n)
    if getattr(call, "note", None):
        text += f"\n{call.note}\n"
    text += f"\nLoad average (1 min) at the end: {os.getloadavg()[0]:.2f}.\n"
    path = write_report(args.out, f"{rep.model}.md", text)
    print(text)
    print(f"wrote {path}")
    return 0
