"""``aieng bench``: the server against the same model in-process, in one run.

1. In-process limit (before): the same processors, session settings, padding
   and postprocessing the server uses, in one process: batch 1, then batches
   of 4/8/16/32 in arrival order and sorted by length.  The best row is the
   limit.
2. The server (a subprocess serving only this model): closed loop at each
   concurrency, then open loop with Poisson arrivals at fractions of the
   limit.  Throughput, p50/p95/p99, errors, mean batch; ratio to the limit.
3. In-process limit again (after), so drift of this shared machine shows; the
   higher of the two is used, which makes the ratio conservative.

Writes ``<out>/<model>.md`` (the tables) and ``<out>/<model>.png``
(latency vs throughput).  Speed targets live here, never in unit tests.
"""
from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from typing import Any

import numpy as np

from aieng.loadgen import run_level, sample_inputs

BATCHES = (1, 4, 8, 16, 32)


def _spec(model: str, repo: str):
    from aieng.model_repo import latest, scan

    versions = scan(repo, [model])[model]
    return versions[latest(versions)]


def inprocess_limit(model: str, repo: str, inputs: list[dict], threads: int, spinning: bool) -> dict[str, Any]:
    """Sentences (requests) per second, everything in this one process."""
    from aieng.gpu_executor.sessions import ModelSession
    from aieng.postprocess_workers.ops import OPS
    from aieng.preprocess_workers import PROCESSORS

    spec = _spec(model, repo)
    pre = PROCESSORS[spec.preprocess["type"]](spec)
    post = OPS[spec.postprocess["type"]](spec)
    sess = ModelSession(spec, "auto", threads, spinning)
    sess.warmup()
    max_b = int(spec.batching["max_batch_size"])

    def encode(items: list[dict]) -> list:
        if getattr(pre, "batchable", False):
            return pre.process_many([pre.check(i) for i in items])
        return [pre.process(i) for i in items]

    def run(batch: int, order: list[int]) -> float:
        t0 = time.perf_counter()
        for s in range(0, len(order), batch):
            encs = encode([inputs[i] for i in order[s:s + batch]])
            feeds, sizes = sess.feeds_from([dict(e[0]) for e in encs])
            outs = sess.run(feeds)
            for row in range(len(encs)):
                post(dict(sess.request_outputs(outs, row, sizes[row])), {})
        return len(order) / (time.perf_counter() - t0)

    arrival = list(range(len(inputs)))
    lengths = [e[1] for e in encode(inputs)]
    by_len = sorted(arrival, key=lambda i: lengths[i])
    run(min(8, max_b), arrival[:64])  # warm caches
    rows = []
    lat1 = []
    for i in arrival[:50]:  # batch-1 latency, one request at a time
        t0 = time.perf_counter()
        run(1, [i])
        lat1.append(time.perf_counter() - t0)
    for b in BATCHES:
        if b > max_b:
            continue
        rows.append({"batch": b, "arrival": run(b, arrival), "sorted": run(b, by_len) if b > 1 else None})
    best = max(max(r["arrival"], r["sorted"] or 0) for r in rows)
    return {"rows": rows, "best": best, "batch1_p50_ms": float(np.median(lat1)) * 1000}


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


def _start_server(model: str, repo: str):
    import socket
    import subprocess
    import sys

    from aieng.client import Client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    addr = f"tcp://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not (k.startswith("AIENG_") and k not in _PASS_THROUGH)}
    env.update({"AIENG_FRONTEND_ADDR": addr, "AIENG_MODEL_REPOSITORY": repo, "AIENG_MODELS": model,
                "AIENG_LOG_LEVEL": "WARNING", "AIENG_HTTP_ADDR": ""})
    log = tempfile.NamedTemporaryFile(prefix="aieng-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "aieng.cli", "serve"], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log.name}")
        try:
            with Client(addr, timeout_s=1.0, dealer=True) as c:
                if c.health().get("ready"):
                    return proc, addr, log.name
        except (TimeoutError, Exception):
            pass
    proc.kill()
    raise RuntimeError(f"server not ready; see {log.name}")


# Tuning variables the bench passes to the server it starts (everything else is reset).
_PASS_THROUGH = {"AIENG_PREPROCESS_WORKERS", "AIENG_POSTPROCESS_WORKERS", "AIENG_MAX_BATCH_SIZE",
                 "AIENG_MAX_WAIT_MS", "AIENG_INTRA_OP_THREADS", "AIENG_ORT_SPINNING", "AIENG_DEVICE"}


def server_side(model: str, repo: str, inputs: list[dict], levels: list[int], rates: list[float],
                duration: float, limit: float, n_requests: int) -> dict[str, Any]:
    import signal

    from aieng.report import fetch

    proc, addr, log = _start_server(model, repo)
    try:
        closed = []
        for c in levels:
            asyncio.run(run_level(addr, model, inputs[:min(len(inputs), 4 * c)], c, 60))  # warm this level
            fetch(addr, reset=True)
            r = asyncio.run(run_level(addr, model, inputs[:n_requests], c, 60))
            r["report"] = fetch(addr)["models"].get(f"{model}", {})
            closed.append(r)
        opened = [asyncio.run(open_loop(addr, model, inputs, f * limit, duration, 60)) for f in rates]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"closed": closed, "open": opened, "log": log}


def _fmt_table(model: str, before: dict, after: dict, srv: dict, limit: float, rates: list[float]) -> str:
    lines = [f"# aieng bench: {model}", "",
             f"In-process limit (same processors, session settings and padding, one process): "
             f"**{limit:.1f} req/s** (best row; before {before['best']:.1f}, after {after['best']:.1f}); "
             f"batch-1 latency p50 {before['batch1_p50_ms']:.2f} ms.", "",
             "| batch | arrival order req/s | sorted by length req/s |", "|---:|---:|---:|"]
    for r in before["rows"]:
        srt = f"{r['sorted']:.1f}" if r["sorted"] else "-"
        lines.append(f"| {r['batch']} | {r['arrival']:.1f} | {srt} |")
    lines += ["", "Server, closed loop:", "",
              "| concurrency | req/s | ratio to limit | p50 ms | p95 ms | p99 ms | p99/p50 | mean batch | padding waste | errors |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in srv["closed"]:
        rep = r.get("report") or {}
        waste = f"{100 * rep['padding_waste']:.1f}%" if rep else "-"
        lines.append(f"| {r['concurrency']} | {r['rps']:.1f} | {r['rps'] / limit:.2f} | {r['p50_ms']:.2f} | "
                     f"{r['p95_ms']:.2f} | {r['p99_ms']:.2f} | {r['p99_ms'] / max(r['p50_ms'], 1e-9):.2f} | "
                     f"{r['mean_batch']:.2f} | {waste} | {r['errors'] or '-'} |")
    lines += ["", "Server, open loop (Poisson arrivals):", "",
              "| offered req/s | answered req/s | ratio to limit | p50 ms | p95 ms | p99 ms | errors |",
              "|---:|---:|---:|---:|---:|---:|---|"]
    for r in srv["open"]:
        lines.append(f"| {r['rate']:.1f} | {r['rps']:.1f} | {r['rps'] / limit:.2f} | {r['p50_ms']:.2f} | "
                     f"{r['p95_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors'] or '-'} |")
    c1 = next((r for r in srv["closed"] if r["concurrency"] == 1), None)
    if c1:
        lines += ["", f"p50 at concurrency 1 minus in-process batch-1 p50: "
                      f"{c1['p50_ms'] - before['batch1_p50_ms']:+.2f} ms"]
    return "\n".join(lines) + "\n"


def _plot(model: str, srv: dict, limit: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["rps"] for r in srv["closed"]]
    for key, style in (("p50_ms", "o-"), ("p99_ms", "s--")):
        ax.plot(xs, [r[key] for r in srv["closed"]], style, label=f"closed loop {key[:3]}")
    ax.plot([r["rps"] for r in srv["open"]], [r["p50_ms"] for r in srv["open"]], "^-", label="open loop p50")
    ax.axvline(limit, color="grey", linestyle=":", label=f"in-process limit {limit:.0f}/s")
    ax.set_xlabel("answered requests per second")
    ax.set_ylabel("latency ms")
    ax.set_yscale("log")
    ax.set_title(f"aieng {model}: latency vs throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_bench(args) -> int:
    from aieng.config import load_config
    from aieng.envs import cpu_count

    cfg = load_config()
    repo = cfg.model_repository
    threads = cfg.intra_op_threads or cpu_count()
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    rates = [float(x) for x in str(args.rates).split(",") if x]
    inputs = sample_inputs(args.model, max(args.requests, 400))
    print(f"bench {args.model}: {len(inputs)} inputs, levels {levels}, executor threads {threads}", flush=True)
    before = inprocess_limit(args.model, repo, inputs, threads, cfg.ort_spinning)
    print(f"in-process limit (before): {before['best']:.1f} req/s", flush=True)
    srv = server_side(args.model, repo, inputs, levels, rates, args.duration, before["best"], args.requests)
    after = inprocess_limit(args.model, repo, inputs, threads, cfg.ort_spinning)
    limit = max(before["best"], after["best"])
    text = _fmt_table(args.model, before, after, srv, limit, rates)
    os.makedirs(args.out, exist_ok=True)
    md = os.path.join(args.out, f"{args.model}.md")
    with open(md, "w", encoding="utf-8") as fh:
        fh.write(text)
    _plot(args.model, srv, limit, os.path.join(args.out, f"{args.model}.png"))
    print(text)
    print(f"wrote {md} and {args.model}.png in {args.out}")
    return 0
