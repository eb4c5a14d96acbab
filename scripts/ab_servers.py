#!/usr/bin/env python3
"""Whole servers side by side: each variant a real server on a free loopback port, driven by the same closed
loop (``loadgen.run_level``) with the same inputs, the variants interleaved round after round so that a noisy
neighbour falls on each alike.  Prints each round and then, per variant, the p50 over every round and the p50
of each step of the per-request timing (``timing_us``).

A variant is ``[label, checkout, env]``: ``checkout`` is the root of a checkout to run the server from (for
example a ``git worktree`` of an older commit, with ``models`` linked to this one's), or ``"baseline"`` for
``python -m aieng.tools.baseline`` (``env`` may give ``{"spin": "off"}``); ``env`` holds ``AIENG_*`` settings.
Bounded: ``REQUESTS`` per round, 30 s per request.

A tensor model (a bare ONNX file, a config.pbtxt, a tensor model.yaml) gets requests made from its spec
(``tools/tensor_inputs``), read from the first variant's ``AIENG_MODEL_REPOSITORY`` (else ``models``); each
variant's env may point ``AIENG_MODEL_REPOSITORY`` at a repository of its own (the baseline reads it too), and
any ``SHAPE`` after the variants is a ``--shape`` value (``32``: every open axis; ``NAME=1x32``).

    .venv/bin/python scripts/ab_servers.py minilm 1 300 3 \\
        '[["before", "/tmp/before", {}], ["now", ".", {}], ["baseline", "baseline", {}]]'
    .venv/bin/python scripts/ab_servers.py mz 32 300 3 \\
        '[["bare", ".", {"AIENG_MODEL_REPOSITORY": "/tmp/a"}],
          ["yaml", ".", {"AIENG_MODEL_REPOSITORY": "/tmp/b"}]]' 32
"""
from __future__ import annotations

import asyncio
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aieng.tools.bench.kit import free_addr, spawn, stop_server  # noqa: E402
from aieng.tools.loadgen import run_level, sample_inputs  # noqa: E402

STEPS = ("frontend_in", "preprocess_queue", "preprocess", "handoff", "batch_wait", "inference", "postprocess",
         "hop.to_postprocess", "hop.to_frontend")


def start(label: str, checkout: str, extra: dict, model: str):
    addr = free_addr()
    models = extra.get("AIENG_MODEL_REPOSITORY") or os.path.join(ROOT, "models")
    if checkout == "baseline":
        argv = [sys.executable, "-m", "aieng.tools.baseline", "--model", model, "--repo", models,
                "--addr", addr, "--spinning", extra.get("spin", "on")]
        env, cwd = dict(os.environ), ROOT
    else:
        argv = [sys.executable, "-m", "aieng.cli", "serve"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
        env.update({"AIENG_FRONTEND_ADDR": addr, "AIENG_MODEL_REPOSITORY": models, "AIENG_MODELS": model,
                    "AIENG_LOG_LEVEL": "WARNING", "AIENG_HTTP_ADDR": "", "AIENG_OIP_HTTP_ADDR": "",
                    "AIENG_OIP_GRPC_ADDR": ""})
        env.update(extra)
        cwd = os.path.abspath(checkout)
    here = os.getcwd()
    os.chdir(cwd)  # python -m imports the package of the working directory first
    try:
        proc, _ = spawn(label, argv, env, addr, lambda h: bool(h.get("ready")))
    finally:
        os.chdir(here)
    return proc, addr


def main() -> int:
    model, conc, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    variants = json.loads(sys.argv[5])
    repo = variants[0][2].get("AIENG_MODEL_REPOSITORY") or os.path.join(ROOT, "models")
    inputs = sample_inputs(model, n, seed=3, repo=repo, shapes=sys.argv[6:])
    lat: dict[str, list] = {v[0]: [] for v in variants}
    hops: dict[str, list] = {v[0]: [] for v in variants}
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    for r in range(rounds):
        for label, checkout, extra in variants:
            proc, addr = start(label, checkout, extra, model)
            try:
                asyncio.run(run_level(addr, model, inputs[:30], conc, 30))  # warm
                out = asyncio.run(run_level(addr, model, inputs, conc, 30))
            finally:
                stop_server(proc)
            lat[label].append(out["latencies_ms"])
            hops[label] += [t for t in out["hops"] if "total" in t]
            print(f"round {r} {label:14s} req/s {out['rps']:7.1f} p50 {out['p50_ms']:7.2f} "
                  f"p99 {out['p99_ms']:8.2f} errors {out['errors'] or '-'}", flush=True)
    for label in lat:
        all_ms = np.concatenate(lat[label])
        print(f"{label:14s} p50 {np.percentile(all_ms, 50):7.2f} ms  mean {all_ms.mean():7.2f} ms")
        if hops[label]:
            print("   ", " ".join(f"{k}={np.percentile([t.get(k, 0) for t in hops[label]], 50):.0f}"
                             for k in STEPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
