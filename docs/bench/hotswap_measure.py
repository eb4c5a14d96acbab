"""Measure hot swap on a real server: a swap under steady load, and the executor's RSS over load cycles.

Usage (from the repo root, after scripts/fetch_models.py built the demo versions)::

    python docs/bench/hotswap_measure.py [--repo models] [--swap minilm:2] [--swaps 5] [--rate 15]
                                      [--cycles 50] [--cycle tabular:2] [--load-priority idle|low]

Starts a server on the repository (its own runtime and state dirs under a temp dir), then:

1. *swap under load*: a steady open-loop load of ``--rate`` requests/s alternating ``minilm`` and
   ``tabular`` (unpinned: version 1 serves; at most 64 in flight; sent from a process of its own) for
   ``--steady-s`` seconds (the first 3 s are not counted: warming), then ``--swaps`` times: ``load`` of
   ``--swap`` over the admin socket (in process: no CLI start-up on the measured machine), polled
   every ``POLL_S`` (0.2 s, as ``aieng models load`` polls) until it is routable, ``--after-s`` more
   seconds, its unload, 2 s.  Prints each model's steady p99 and the p99 of the requests sent while a
   load was under way (all swaps pooled), the slowest request of each swap, and the failed requests.
2. *cycles*: ``--cycles`` load/unload cycles of ``--cycle`` with one client loop running, sampling
   the executor's RSS (psutil) after each unload; prints the first, the 5th and the last samples.

Bounded: every loop stops at its count or time limit; the server is stopped at the end (by pid).
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from aieng.cli.rollout import call  # noqa: E402
from aieng.client import AsyncClient, build_request  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402

GAP_S = 2.0  # after each unload, before the next swap
POLL_S = float(os.environ.get("POLL_S", "0.2"))  # as `aieng models load` polls
INPUTS = {"minilm": {"text": "a steady stream of sentences to embed, one after another"},
          "tabular": {"island": "Dream", "bill_length_mm": 39.0, "flipper_length_mm": 190.0}}


class Traffic:
    """Requests at ``rate`` per second (open loop: a slow answer does not slow the sending), sent from a
    process of its own: the admin polling here would otherwise take the GIL from the measuring client
    and show in its latencies (measured: 5-7 ms of a 12 ms request that the server's stage rows did not
    have).  ``replies`` is filled by ``join``: (sent, latency, model, ok, code), monotonic clock (one for
    every process)."""

    def __init__(self, addr: str, models: list[str], rate: float, max_s: float):
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self._conn, child = ctx.Pipe(duplex=False)
        self.replies: list[tuple[float, float, str, bool, str]] = []
        self.proc = ctx.Process(target=_traffic_main, args=(addr, models, rate, max_s, self.stop, child),
                                daemon=True)

    def start(self) -> None:
        self.proc.start()

    def join(self, timeout_s: float) -> None:
        self.stop.set()
        if self._conn.poll(timeout_s):
            self.replies = self._conn.recv()
        self.proc.join(5)


def _traffic_main(addr: str, models: list[str], rate: float, max_s: float, stop, conn) -> None:
    replies: list[tuple[float, float, str, bool, str]] = []

    async def run() -> None:
        client = AsyncClient(addr, timeout_s=30)
        end = time.monotonic() + max_s
        gate = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            model = models[i % len(models)]
            async with gate:
                t0 = time.monotonic()
                r = await client.call(build_request(i, model, INPUTS[model]), raise_on_error=False)
                code = "" if r["ok"] else r["error"]["code"]
                replies.append((t0, time.monotonic() - t0, model, r["ok"], code))

        tasks, i, start = [], 0, time.monotonic()
        try:
            while not stop.is_set() and time.monotonic() < end:
                tasks.append(asyncio.ensure_future(one(i)))
                i += 1
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            await asyncio.gather(*tasks)
        finally:
            client.close()

    asyncio.run(run())
    conn.send(replies)


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000 if xs else float("nan")


def wait_state(admin: str, model: str, version: str, states: tuple, limit_s: float = 300,
               every_s: float = 0.1) -> dict:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        v = call(admin, "models")["models"][model]["versions"].get(version) or {}
        if (v.get("load") or {}).get("state") in states:
            return v["load"]
        time.sleep(every_s)
    raise TimeoutError(f"{model}:{version} not in {states} within {limit_s}s")


def swap_under_load(srv, admin: str, key: str, steady_s: float, after_s: float, rate: float,
                    swaps: int) -> None:
    """``swaps`` swaps (load until routable, ``after_s``, unload, ``GAP_S``) after ``steady_s`` of steady
    load; the requests sent while a load was under way are pooled, so their p99 is a p99 (one swap of
    2.5 s at 20 requests/s per model holds about 50: their "p99" is their maximum)."""
    model, version = key.split(":")
    traffic = Traffic(srv.addr, ["minilm", "tabular"], rate, steady_s + swaps * (after_s + GAP_S + 30) + 300)
    traffic.start()
    time.sleep(steady_s)
    windows, loads = [], []
    for _ in range(swaps):
        t0 = time.monotonic()
        reply = call(admin, "load", model=model, version=version)
        assert reply["ok"], reply
        loads.append(wait_state(admin, model, version, ("ready", "failed"), every_s=POLL_S))
        windows.append((t0, time.monotonic()))
        time.sleep(after_s)
        assert call(admin, "unload", model=model, version=version)["ok"]
        wait_state(admin, model, version, ("unloaded",), every_s=POLL_S)
        time.sleep(GAP_S)
    traffic.join(60)
    first = windows[0][0]
    took = ", ".join(f"{t1 - t0:.2f}" for t0, t1 in windows)
    print(f"{swaps} swaps of {key}: {sorted({ld['state'] for ld in loads})} after {took} s "
          f"({loads[0]['golden_cases']} golden cases each)")

    def swap_of(t: float) -> int | None:
        return next((i for i, (t0, t1) in enumerate(windows) if t0 <= t <= t1), None)

    for name in ("minilm", "tabular"):
        before = [lat for t, lat, mdl, ok, _ in traffic.replies
                  if mdl == name and first - steady_s + 3 < t < first]
        during = [(lat, t, swap_of(t)) for t, lat, mdl, ok, _ in traffic.replies
                  if mdl == name and swap_of(t) is not None]
        lats = [lat for lat, _, _ in during]
        print(f"  {name}: p99 steady {p99(before):.1f} ms ({len(before)} req), during the swaps "
              f"{p99(lats):.1f} ms ({len(lats)} req): ratio {p99(lats) / p99(before):.2f}")
        per_swap = [max((lat for lat, _, i in during if i == k), default=float("nan")) * 1000
                    for k in range(swaps)]
        print("    slowest request of each swap: " + ", ".join(f"{x:.1f}" for x in per_swap) + " ms")
        slow = sorted(during, reverse=True)[:5]
        print("    slowest during the swaps: " + ", ".join(
            f"{lat * 1000:.1f} ms (swap {i + 1} at +{t - windows[i][0]:.2f}s)" for lat, t, i in slow))
    failed = [code for *_, ok, code in traffic.replies if not ok]
    print(f"  failed requests: {len(failed)} of {len(traffic.replies)} {sorted(set(failed))}")


def cycles(srv, admin: str, key: str, n: int) -> None:
    model, version = key.split(":")
    executor = psutil.Process(srv.child_pid("aieng::executor"))
    traffic = Traffic(srv.addr, ["tabular"], 20, 3600)
    traffic.start()
    rss = []
    t0 = time.monotonic()
    try:
        for i in range(n):
            assert call(admin, "load", model=model, version=version)["ok"]
            assert wait_state(admin, model, version, ("ready", "failed"))["state"] == "ready"
            assert call(admin, "unload", model=model, version=version)["ok"]
            wait_state(admin, model, version, ("unloaded",))
            rss.append(executor.memory_info().rss / 2**20)
            print(f"  cycle {i + 1}: executor RSS {rss[-1]:.1f} MiB", flush=True)
    finally:
        traffic.join(60)
    failed = sum(1 for *_, ok, _ in traffic.replies if not ok)
    print(f"{n} load/unload cycles of {key} in {time.monotonic() - t0:.0f}s: executor RSS after cycle 1 "
          f"{rss[0]:.1f} MiB, after 5 {rss[min(4, n - 1)]:.1f}, after {n} {rss[-1]:.1f} MiB "
          f"(max {max(rss):.1f}); {failed} failed of {len(traffic.replies)} requests meanwhile")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default="models")
    ap.add_argument("--swap", default="minilm:2")
    ap.add_argument("--cycle", default="tabular:2")
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--steady-s", type=float, default=10.0)
    ap.add_argument("--after-s", type=float, default=2.0)
    ap.add_argument("--swaps", type=int, default=5, help="swaps under load, pooled (each: load, unload)")
    ap.add_argument("--rate", type=float, default=15.0, help="requests/s of the steady load")
    ap.add_argument("--load-priority", default="idle", choices=("idle", "low"), help="AIENG_LOAD_PRIORITY")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hotswap-")
    os.makedirs(os.path.join(tmp, "run"))
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=os.path.abspath(args.repo),
                        AIENG_STATE_DIR=tmp + "/state", AIENG_RUNTIME_DIR=tmp + "/run",
                        AIENG_LOAD_PRIORITY=args.load_priority)
    admin = f"ipc://{tmp}/run/admin.sock"
    srv.start()
    try:
        base = psutil.Process(srv.child_pid("aieng::executor")).memory_info().rss / 2**20
        print(f"executor RSS before any run-time load: {base:.1f} MiB")
        swap_under_load(srv, admin, args.swap, args.steady_s, args.after_s, args.rate, args.swaps)
        if args.cycles:
            cycles(srv, admin, args.cycle, args.cycles)
    finally:
        print(f"server stopped with code {srv.stop()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
