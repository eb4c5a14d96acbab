#!/usr/bin/env python3
"""TLS on the OIP doors against TLS off, side by side (issue 37).

Two servers serving one model at once, one with its OIP doors behind TLS (a throwaway CA made here with
``cryptography``, ``tests/tlscerts``), one without; at each concurrency the same closed loop over four sides
(HTTP and gRPC, each plain and TLS) in interleaved rounds (``tools/bench/rounds.closed_rounds``, as
``aieng bench --transport`` measures), so drift on a shared machine falls on every side alike.  Prints per
level each side's req/s, p50 and server CPU per request, and TLS's ratio to plain per door.  Bounded:
``--requests`` per side per level.  What a new connection's handshake costs: ``tls_handshake.py``.

    .venv/bin/python docs/bench/tls_ab.py --model minilm --concurrency 1,32 --requests 600
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from aieng.tools.bench.kit import free_port, start_server, stop_server  # noqa: E402
from aieng.tools.bench.rounds import ROUNDS, Side, closed_rounds  # noqa: E402
from aieng.tools.loadgen import sample_inputs  # noqa: E402
from tests.tlscerts import Ca  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--requests", type=int, default=600)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="tls_ab_"))
    ca = Ca(tmp, "bench")
    cert = ca.issue("server", "bench-server", server=True)
    repo = os.path.join(ROOT, "models")
    procs, sides = [], {}
    try:
        for tls in (False, True):
            ports = {"http": f"127.0.0.1:{free_port()}", "grpc": f"127.0.0.1:{free_port()}"}
            env = {"AIENG_OIP_HTTP_ADDR": ports["http"], "AIENG_OIP_GRPC_ADDR": ports["grpc"]}
            if tls:
                env.update(AIENG_OIP_TLS_CERT_FILE=str(cert.cert), AIENG_OIP_TLS_KEY_FILE=str(cert.key))
            proc, _, _ = start_server(args.model, repo, env)
            procs.append(proc)
            for door in ("http", "grpc"):
                sides[f"{door} {'tls' if tls else 'plain'}"] = Side(
                    ports[door], proc.pid, transport=door, tls_ca=str(ca.cert) if tls else None)
        inputs = sample_inputs(args.model, 512, repo=repo)
        out = closed_rounds(sides, args.model, inputs, levels, args.requests, ROUNDS)
    finally:
        for proc in procs:
            stop_server(proc)
    print(f"\n{args.model}, {args.requests} requests per side per level, {ROUNDS} interleaved rounds\n")
    print("| c | door | TLS | req/s | TLS / plain | p50 ms | server CPU ms/req | errors |")
    print("|---:|---|---|---:|---:|---:|---:|---|")
    for i, c in enumerate(levels):
        for door in ("http", "grpc"):
            plain = out[f"{door} plain"][i]
            for tls in ("plain", "tls"):
                r = out[f"{door} {tls}"][i]
                rel = f"{r['rps'] / plain['rps']:.2f}" if tls == "tls" and plain["rps"] else "-"
                print(f"| {c} | {door} | {'on' if tls == 'tls' else 'off'} | {r['rps']:.1f} | {rel} | "
                      f"{r['p50_ms']:.2f} | {r['cpu']['total']:.2f} | {r['errors'] or '-'} |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
