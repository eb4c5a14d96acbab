"""A simple closed-loop load generator: ``aieng load``.

For each concurrency level, that many asyncio workers each send a request and
wait for its answer, over one DEALER socket, until ``--requests`` answers
have come back.  Inputs come from a deterministic mix, so runs compare.
Reports requests/s, p50/p95/p99 latency and errors per level.

``open_loop`` (used by ``aieng bench``) sends with Poisson arrivals at a fixed
rate for a fixed time instead, whatever the answers do.
"""
from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import numpy as np

WORDS = ("the model serves requests over sockets while workers tokenize text and the executor runs "
         "batches of padded sequences through onnx runtime on two small cores shared with everyone").split()


def text_mix(n: int, seed: int = 0) -> list[str]:
    """60% short (4-12 words), 30% medium (20-40), 10% long (80-120): mean about 36 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        lo, hi = (4, 12) if r < 0.6 else (20, 40) if r < 0.9 else (80, 120)
        out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))))
    return out


def sample_inputs(model: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    if model == "minilm":
        return [{"text": t} for t in text_mix(n, seed)]
    if model == "orientation":
        import cv2

        rng = np.random.default_rng(seed)
        imgs = []
        for i in range(min(n, 16)):
            h, w = int(rng.integers(300, 900)), int(rng.integers(300, 900))
            img = rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)
            imgs.append({"image": cv2.imencode(".jpg", img)[1].tobytes()})
        return [imgs[i % len(imgs)] for i in range(n)]
    if model == "tabular":
        rng = random.Random(seed)
        return [{"bill_length_mm": rng.uniform(32, 60), "bill_depth_mm": rng.uniform(13, 21),
                 "flipper_length_mm": rng.uniform(170, 230), "body_mass_g": rng.uniform(2700, 6300),
                 "island": rng.choice(["Biscoe", "Dream", "Torgersen"]),
                 "sex": rng.choice(["male", "female"])}
                for _ in range(n)]
    raise SystemExit(f"no input generator for model {model!r}")


async def run_level(addr: str | None, model: str, inputs: list[dict], concurrency: int,
                    timeout_s: float) -> dict[str, Any]:
    from aieng.client import AsyncClient

    client = AsyncClient(addr, timeout_s=timeout_s)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    batches: list[int] = []
    it = iter(range(len(inputs)))

    async def worker() -> None:
        for i in it:
            t0 = time.perf_counter()
            reply = await client.infer(model, inputs[i], raise_on_error=False)
            latencies.append(time.perf_counter() - t0)
            if reply.get("ok"):
                batches.append(int(reply.get("batch", 1)))
            else:
                code = reply["error"]["code"]
                errors[code] = errors.get(code, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    client.close()
    lat = np.asarray(latencies) * 1000
    return {"concurrency": concurrency, "requests": len(latencies), "seconds": round(elapsed, 3),
            "rps": round(len(latencies) / elapsed, 1), "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "mean_batch": round(float(np.mean(batches)), 2) if batches else 0.0, "errors": errors}


async def open_loop(addr: str, model: str, inputs: list[dict], rate: float, duration: float,
                    timeout_s: float) -> dict[str, Any]:
    from aieng.client import AsyncClient

    client = AsyncClient(addr, timeout_s=timeout_s)
    rng = random.Random(1)
    lat: list[float] = []
    errors: dict[str, int] = {}

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            reply = await client.infer(model, inputs[i % len(inputs)], raise_on_error=False)
        except asyncio.TimeoutError:
            errors["CLIENT_TIMEOUT"] = errors.get("CLIENT_TIMEOUT", 0) + 1
            return
        if reply.get("ok"):
            lat.append(time.perf_counter() - t0)
        else:
            code = reply["error"]["code"]
            errors[code] = errors.get(code, 0) + 1

    tasks = []
    start = time.perf_counter()
    nxt = start
    i = 0
    while nxt - start < duration:
        await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
        nxt += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    client.close()
    ms = np.asarray(lat) * 1000 if lat else np.zeros(1)
    return {"rate": rate, "sent": i, "ok": len(lat), "rps": len(lat) / elapsed,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "errors": errors}


def main_load(args) -> int:
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    inputs = sample_inputs(args.model, args.requests)
    print(f"model={args.model} requests/level={args.requests}")
    print("| concurrency | req/s | p50 ms | p95 ms | p99 ms | mean batch | errors |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for c in levels:
        asyncio.run(run_level(args.addr, args.model, inputs[:min(len(inputs), 20)], c, args.timeout))  # warm
        r = asyncio.run(run_level(args.addr, args.model, inputs, c, args.timeout))
        print(f"| {c} | {r['rps']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['mean_batch']} | "
              f"{r['errors'] or '-'} |", flush=True)
    return 0
