"""``aieng soak``: a steady load for a chosen time, watching for anything that grows.

Starts a server (only the chosen model), drives it with a closed loop, and every
interval samples, per aieng process, resident memory and open file
descriptors, plus the bytes of shared memory the instance really uses
(allocated tmpfs blocks) and the interval's latency percentiles.  At the end
it fits a line to each series over the second half of the run (after warm-up)
and fails (exit 1) if resident memory grows faster than ``--max-rss-mib-per-min``,
or file descriptors or shared memory grow at all beyond a small allowance.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import numpy as np
import psutil

from aieng.tools.loadgen import sample_inputs
from aieng.wire import shm


def _shm_bytes(instance: str) -> int:
    total = 0
    for name in shm.list_segments(instance):
        try:
            total += os.stat(os.path.join(shm.SHM_DIR, name)).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def _slope_per_min(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 3:
        return 0.0
    return float(np.polyfit(np.asarray(ts) / 60.0, np.asarray(ys, dtype=np.float64), 1)[0])


async def _drive(addr: str, model: str, inputs: list[dict], concurrency: int, until: float,
                 lat: list[tuple[float, float]], errors: dict[str, int]) -> None:
    from aieng.client import AsyncClient

    client = AsyncClient(addr, timeout_s=30)
    counter = iter(range(10 ** 12))

    async def worker() -> None:
        while time.monotonic() < until:
            i = next(counter)
            t0 = time.monotonic()
            r = await client.infer(model, inputs[i % len(inputs)], raise_on_error=False)
            if r.get("ok"):
                lat.append((t0, time.monotonic() - t0))
            else:
                errors[r["error"]["code"]] = errors.get(r["error"]["code"], 0) + 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    client.close()


async def _sample(srv_pid: int, until: float, interval: float, rows: list[dict[str, Any]]) -> None:
    sup = psutil.Process(srv_pid)
    start = time.monotonic()
    while time.monotonic() < until:
        await asyncio.sleep(interval)
        row: dict[str, Any] = {"t": time.monotonic() - start, "rss": {}, "fds": {}}
        for p in sup.children():
            try:
                title = p.cmdline()[0]
                if title.startswith("aieng::"):
                    row["rss"][title] = p.memory_info().rss
                    row["fds"][title] = p.num_fds()
            except (psutil.Error, IndexError):
                pass
        row["shm"] = _shm_bytes(str(srv_pid))
        rows.append(row)


def soak(model: str, seconds: float, interval: float, concurrency: int, max_rss_mib_per_min: float) -> int:
    from aieng.config import load_config
    from aieng.tools.benchkit import start_server

    cfg = load_config()
    proc, addr, log = start_server(model, cfg.model_repository)
    lat: list[tuple[float, float]] = []
    errors: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    try:
        until = time.monotonic() + seconds

        async def main() -> None:
            inputs = sample_inputs(model, 200)
            await asyncio.gather(_drive(addr, model, inputs, concurrency, until, lat, errors),
                                 _sample(proc.pid, until, interval, rows))

        asyncio.run(main())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    half = [r for r in rows if r["t"] >= seconds / 2]
    t0 = min(t for t, _ in lat) if lat else 0.0
    print(f"soak {model}: {seconds:.0f}s, concurrency {concurrency}, {len(lat)} answered, "
          f"errors {errors or '-'}")
    rss_columns = " | ".join(f"{k} RSS MiB" for k in sorted(rows[0]["rss"]))
    print("| t s | answered | p50 ms | p99 ms | shm KiB | " + rss_columns + " |")
    for r in rows:
        window = [d for t, d in lat if r["t"] - interval <= t - t0 < r["t"]]
        p50 = np.percentile(window, 50) * 1000 if window else 0
        p99 = np.percentile(window, 99) * 1000 if window else 0
        print(f"| {r['t']:.0f} | {len(window)} | {p50:.1f} | {p99:.1f} | {r['shm'] >> 10} | "
              + " | ".join(f"{r['rss'].get(k, 0) / 2 ** 20:.1f}" for k in sorted(rows[0]["rss"])) + " |")
    failures = []
    for title in sorted(rows[0]["rss"]):
        ts = [r["t"] for r in half if title in r["rss"]]
        slope = _slope_per_min(ts, [r["rss"][title] / 2 ** 20 for r in half if title in r["rss"]])
        fds = [r["fds"][title] for r in half if title in r["fds"]]
        print(f"{title}: RSS slope {slope:+.2f} MiB/min, fds {min(fds)}..{max(fds)}")
        if slope > max_rss_mib_per_min:
            failures.append(f"{title} RSS grows {slope:.2f} MiB/min")
        if max(fds) - min(fds) > 4:
            failures.append(f"{title} open fds grow {min(fds)} -> {max(fds)}")
    shm_slope = _slope_per_min([r["t"] for r in half], [r["shm"] / 2 ** 20 for r in half])
    print(f"shared memory in use: slope {shm_slope:+.2f} MiB/min, last {rows[-1]['shm'] >> 10} KiB")
    if shm_slope > max_rss_mib_per_min:
        failures.append(f"shared memory grows {shm_slope:.2f} MiB/min")
    if not lat:
        failures.append("no request was answered")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def main_soak(args) -> int:
    return soak(args.model, args.seconds, args.interval, args.concurrency, args.max_rss_mib_per_min)
