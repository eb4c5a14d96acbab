#!/usr/bin/env python3
"""A 5 ms model beside a saturating OCR client: does it stay near 5 ms?  (issue 20, finding 16)

Starts a server from a checkout (``--checkout``, default this one) serving ``ocr`` (textdet -> textrec) and
``tabular``; one client keeps ``--pages`` OCR pages in flight, another sends tabular requests one at a time.
First tabular alone (the reference), then beside the OCR load.  Prints tabular's p50/p99 both ways, its
``batch_wait`` p50 beside OCR (how long it waited for a lane), and the pages answered.  Bounded: ``--seconds``
per phase.

    .venv/bin/python docs/bench/share_measure.py [--checkout /tmp/before] [--pages 4] [--seconds 20]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from aieng.client import AsyncClient  # noqa: E402
from aieng.tools.bench.kit import free_addr, spawn, stop_server  # noqa: E402
from aieng.tools.bench.pages import pages  # noqa: E402

PENGUIN = {"island": "Biscoe", "bill_length_mm": 45.1, "body_mass_g": 4000.0, "sex": "female"}


async def tabular_loop(addr: str, until: float) -> tuple[list[float], list[int]]:
    lat, waits = [], []
    client = AsyncClient(addr, timeout_s=60)
    while time.monotonic() < until:
        t0 = time.perf_counter()
        reply = await client.infer("tabular", PENGUIN, raise_on_error=False)
        lat.append((time.perf_counter() - t0) * 1000)
        waits.append(int((reply.get("timing_us") or {}).get("batch_wait", 0)))
    client.close()
    return lat, waits


async def ocr_load(addr: str, images: list[bytes], in_flight: int, until: float) -> int:
    client = AsyncClient(addr, timeout_s=120)
    done = 0

    async def one_at_a_time(i: int) -> None:
        nonlocal done
        while time.monotonic() < until:
            reply = await client.infer("ocr", {"image": images[i % len(images)]}, raise_on_error=False)
            done += bool(reply.get("ok"))
            i += in_flight

    await asyncio.gather(*(one_at_a_time(i) for i in range(in_flight)))
    client.close()
    return done


async def phase(addr: str, images: list[bytes], in_flight: int, seconds: float) -> tuple[list, list, int]:
    until = time.monotonic() + seconds
    if not in_flight:
        lat, waits = await tabular_loop(addr, until)
        return lat, waits, 0
    (lat, waits), n = await asyncio.gather(tabular_loop(addr, until),
                                           ocr_load(addr, images, in_flight, until))
    return lat, waits, n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkout", default=ROOT)
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    addr = free_addr()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update({"AIENG_FRONTEND_ADDR": addr, "AIENG_MODEL_REPOSITORY": os.path.join(ROOT, "models"),
                "AIENG_MODELS": "ocr,textdet,textrec,tabular", "AIENG_LOG_LEVEL": "WARNING",
                "AIENG_HTTP_ADDR": "", "AIENG_OIP_HTTP_ADDR": "", "AIENG_OIP_GRPC_ADDR": ""})
    here = os.getcwd()
    os.chdir(args.checkout)
    try:
        proc, _ = spawn("server", [sys.executable, "-m", "aieng.cli", "serve"], env, addr,
                        lambda h: bool(h.get("ready")))
    finally:
        os.chdir(here)
    images = pages(4)
    print(f"checkout {args.checkout}; load average {os.getloadavg()[0]:.2f}")
    try:
        for label, n in (("tabular alone", 0), (f"beside {args.pages} OCR pages in flight", args.pages)):
            lat, waits, done = asyncio.run(phase(addr, images, n, args.seconds))
            tail = f", {done} pages)" if n else ")"
            print(f"{label:34s} tabular p50 {np.percentile(lat, 50):8.2f} ms"
                  f"  p99 {np.percentile(lat, 99):8.2f} ms"
                  f"  batch_wait p50 {np.percentile(waits, 50) / 1000:7.2f} ms  ({len(lat)} requests{tail}",
                  flush=True)
    finally:
        stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
