"""``aieng soak``: a steady load for a chosen time, watching for anything that grows.

Starts a server (only the chosen model), drives it with a closed loop, and every interval samples, per
aieng process, resident memory, open file descriptors and resident shared memory (``RssShmem``), plus the
bytes of shared memory the instance really uses (allocated tmpfs blocks), and prints one progress line
(``progress_line``).  A request with no reply in time is counted (``timeouts``), as is a reply that comes
after its request's timeout or for an id nobody asked (``late``: the client core's ``unmatched``); neither
stops the run.  At the end it prints the per-interval table and fits a line to each series over the second
half of the run (after warm-up): it fails (exit 1) if resident memory grows faster than
``--max-rss-mib-per-min``, or file descriptors or shared memory grow at all beyond a small allowance.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any, Callable

import numpy as np
import psutil

from aieng.tools.loadgen import sample_inputs
from aieng.wire import shm


class Tally:
    """What the load saw so far.  ``late`` is read from the client core's counts (``unmatched``)."""

    def __init__(self, core_counts: dict[str, int]):
        self.core_counts = core_counts
        self.answered = 0
        self.errors: dict[str, int] = {}
        self.timeouts = 0

    @property
    def late(self) -> int:
        return self.core_counts.get("unmatched", 0)

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


def _shm_bytes(instance: str) -> int:
    total = 0
    for name in shm.list_segments(instance):
        try:
            total += os.stat(os.path.join(shm.SHM_DIR, name)).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def rss_shmem(status: str) -> int:
    """Bytes of shared memory resident in a process, from its /proc/<pid>/status text (0 if absent)."""
    for line in status.splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    return 0


def _slope_per_min(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 3:
        return 0.0
    return float(np.polyfit(np.asarray(ts) / 60.0, np.asarray(ys, dtype=np.float64), 1)[0])


def progress_line(row: dict[str, Any], seconds: float, tally: Tally, before: int) -> str:
    """One interval: elapsed, answered (and since the last line), errors, timeouts, late replies, the
    instance's shared memory, then per process RSS MiB / open fds / resident shared memory KiB."""
    errors = sum(tally.errors.values())
    head = (f"[{row['t']:5.0f}/{seconds:.0f}s] answered {tally.answered} (+{tally.answered - before}) "
            f"errors {errors} timeouts {tally.timeouts} late {tally.late} shm {row['shm'] >> 10} KiB")
    procs = [f"{title.removeprefix('aieng::')} {row['rss'][title] / 2 ** 20:.1f}M/{row['fds'][title]}fd/"
             f"{row['shm_proc'].get(title, 0) >> 10}K" for title in sorted(row["rss"])]
    return " | ".join([head] + procs)


async def _drive(client: Any, model: str, inputs: list[dict], concurrency: int, stop: Callable[[], bool],
                 lat: list[tuple[float, float]], tally: Tally) -> None:
    counter = iter(range(10 ** 12))

    async def worker() -> None:
        while not stop():
            i = next(counter)
            t0 = time.monotonic()
            try:
                r = await client.infer(model, inputs[i % len(inputs)], raise_on_error=False)
            except TimeoutError:  # its reply, should it come, is counted late by the client core
                tally.timeouts += 1
                continue
            if r.get("ok"):
                tally.answered += 1
                lat.append((t0, time.monotonic() - t0))
            else:
                tally.error(str((r.get("error") or {}).get("code", "unknown")))

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def sample(srv_pid: int, start: float) -> dict[str, Any]:
    row: dict[str, Any] = {"t": time.monotonic() - start, "rss": {}, "fds": {}, "shm_proc": {}}
    for p in psutil.Process(srv_pid).children(recursive=True):
        try:
            title = p.cmdline()[0]
            if title.startswith("aieng::"):
                row["rss"][title] = p.memory_info().rss
                row["fds"][title] = p.num_fds()
                with open(f"/proc/{p.pid}/status", encoding="ascii", errors="replace") as fh:
                    row["shm_proc"][title] = rss_shmem(fh.read())
        except (psutil.Error, IndexError, OSError):
            pass
    row["shm"] = _shm_bytes(str(srv_pid))
    return row


async def _sample(srv_pid: int, seconds: float, until: float, interval: float, rows: list[dict[str, Any]],
                  tally: Tally, report: Callable[[str], None]) -> None:
    start = time.monotonic()
    before = 0
    while time.monotonic() < until:
        await asyncio.sleep(min(interval, max(0.0, until - time.monotonic())))
        row = sample(srv_pid, start)
        rows.append(row)
        report(progress_line(row, seconds, tally, before))
        before = tally.answered


def soak(model: str, seconds: float, interval: float, concurrency: int, max_rss_mib_per_min: float,
         timeout_s: float = 30.0) -> int:
    from aieng.client import AsyncClient
    from aieng.config import load_config
    from aieng.tools.bench.kit import start_server

    cfg = load_config()
    proc, addr, log = start_server(model, cfg.model_repository)
    print(f"soak {model}: server {proc.pid} ready; {seconds:.0f}s at concurrency {concurrency}, "
          f"a line every {interval:g}s", flush=True)
    lat: list[tuple[float, float]] = []
    rows: list[dict[str, Any]] = []
    client = AsyncClient(addr, timeout_s=timeout_s)
    tally = Tally(client.core.counts)
    try:
        until = time.monotonic() + seconds

        async def main() -> None:
            inputs = sample_inputs(model, 200, repo=cfg.model_repository)
            await asyncio.gather(
                _drive(client, model, inputs, concurrency, lambda: time.monotonic() >= until, lat, tally),
                _sample(proc.pid, seconds, until, interval, rows, tally, lambda s: print(s, flush=True)))

        asyncio.run(main())
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return summarize(model, seconds, interval, concurrency, max_rss_mib_per_min, lat, rows, tally)


def summarize(model: str, seconds: float, interval: float, concurrency: int, max_rss_mib_per_min: float,
              lat: list[tuple[float, float]], rows: list[dict[str, Any]], tally: Tally) -> int:
    print(f"soak {model}: {seconds:.0f}s, concurrency {concurrency}, {len(lat)} answered, "
          f"errors {tally.errors or '-'}, timeouts {tally.timeouts}, late replies {tally.late}")
    if not rows:
        print("FAIL: no sample taken (--seconds shorter than --interval?)")
        return 1
    half = [r for r in rows if r["t"] >= seconds / 2]
    t0 = min(t for t, _ in lat) if lat else 0.0
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
        fds = [r["fds"][title] for r in half if title in r["fds"]] or [0]
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
    return soak(args.model, args.seconds, args.interval, args.concurrency, args.max_rss_mib_per_min,
                args.timeout)
