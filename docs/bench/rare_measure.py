#!/usr/bin/env python3
"""A rarely asked fast model beside a flooded slow one, with and without the executor's spare lane (issue 33).

Two servers of this checkout serve ``minilm`` and ``tabular``, one with ``AIENG_EXECUTOR_SPARE_LANE=false``,
one with it on.  Round after round each in turn gets the same load, so a noisy neighbour falls on both alike:
one client keeps ``--flood`` minilm requests in flight, another sends one tabular request every ``--gap``
seconds (longer than the lane rule's 2 s sharing window: a rarely asked model).  Prints per round and variant
tabular's p50/p90 and ``batch_wait`` p50, and minilm's answers a second.  Bounded: ``--seconds`` per phase.

    .venv/bin/python docs/bench/rare_measure.py [--rounds 3] [--seconds 24] [--gap 2.4] [--flood 16]
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

PENGUIN = {"island": "Biscoe", "bill_length_mm": 45.1, "body_mass_g": 4000.0, "sex": "female"}
TEXT = {"text": "A man is eating food while reading a long newspaper article about the weather."}


async def rare(addr: str, gap: float, until: float) -> tuple[list[float], list[int]]:
    lat, waits = [], []
    client = AsyncClient(addr, timeout_s=60)
    await asyncio.sleep(gap)  # the flood first
    while time.monotonic() < until:
        t0 = time.perf_counter()
        reply = await client.infer("tabular", PENGUIN, raise_on_error=False)
        lat.append((time.perf_counter() - t0) * 1000)
        waits.append(int((reply.get("timing_us") or {}).get("batch_wait", 0)))
        await asyncio.sleep(gap)
    client.close()
    return lat, waits


async def flood(addr: str, in_flight: int, until: float) -> int:
    client = AsyncClient(addr, timeout_s=60)
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < until:
            ok = bool((await client.infer("minilm", TEXT, raise_on_error=False)).get("ok"))
            done += ok  # not ``done += await ...``: that reads ``done`` before the await and loses counts

    await asyncio.gather(*(loop() for _ in range(in_flight)))
    client.close()
    return done


async def phase(addr: str, args) -> tuple[list, list, int]:
    until = time.monotonic() + args.seconds
    (lat, waits), n = await asyncio.gather(rare(addr, args.gap, until), flood(addr, args.flood, until))
    return lat, waits, n


def start(spare: bool):
    addr = free_addr()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update({"AIENG_FRONTEND_ADDR": addr, "AIENG_MODEL_REPOSITORY": os.path.join(ROOT, "models"),
                "AIENG_MODELS": "minilm,tabular", "AIENG_LOG_LEVEL": "WARNING", "AIENG_HTTP_ADDR": "",
                "AIENG_OIP_HTTP_ADDR": "", "AIENG_OIP_GRPC_ADDR": "",
                "AIENG_EXECUTOR_SPARE_LANE": "true" if spare else "false"})
    proc, _ = spawn("server", [sys.executable, "-m", "aieng.cli", "serve"], env, addr,
                    lambda h: bool(h.get("ready")))
    return addr, proc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=24.0)
    ap.add_argument("--gap", type=float, default=2.4)
    ap.add_argument("--flood", type=int, default=16)
    args = ap.parse_args()
    os.chdir(ROOT)
    servers = {"spare lane off": start(False), "spare lane on": start(True)}
    print(f"load average {os.getloadavg()[0]:.2f}; {args.flood} minilm in flight, tabular every {args.gap} s")
    every: dict[str, list[float]] = {k: [] for k in servers}
    rates: dict[str, list[float]] = {k: [] for k in servers}
    try:
        for r in range(args.rounds):
            for label, (addr, _) in servers.items():
                lat, waits, n = asyncio.run(phase(addr, args))
                every[label] += lat
                rates[label].append(n / args.seconds)
                print(f"round {r} {label:15s} tabular p50 {np.percentile(lat, 50):7.2f} ms"
                      f"  p90 {np.percentile(lat, 90):7.2f} ms"
                      f"  batch_wait p50 {np.percentile(waits, 50) / 1000:6.2f} ms ({len(lat)})"
                      f"  minilm {n / args.seconds:6.1f} req/s", flush=True)
        for label in servers:
            print(f"all     {label:15s} tabular p50 {np.percentile(every[label], 50):7.2f} ms"
                  f"  p90 {np.percentile(every[label], 90):7.2f} ms"
                  f"  minilm {np.mean(rates[label]):6.1f} req/s")
    finally:
        for _, proc in servers.values():
            stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
