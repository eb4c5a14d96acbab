#!/usr/bin/env python3
"""What a new connection costs on the OIP doors with TLS on against TLS off (issue 37).

Two servers serving ``tabular`` at once, one with its OIP doors behind TLS (a throwaway CA made here with
``cryptography``, ``tests/tlscerts``), one without; in interleaved rounds, ``--connections`` new connections
to each door of each: HTTP: connect, (handshake), one ``GET /v2/health/live``, read the answer, close;
gRPC: a new channel, one ``ServerLive``, close.  Prints the p50 and p90 per new connection and the
difference: the handshake's cost as a client sees it.  Bounded: ``--connections`` per door per round,
``--rounds`` rounds, loopback only.

    .venv/bin/python docs/bench/tls_handshake.py --connections 200 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import grpc  # noqa: E402

from aieng.gateway.proto import grpc_service_pb2, grpc_service_pb2_grpc  # noqa: E402
from aieng.tools.bench.kit import free_port, start_server, stop_server  # noqa: E402
from tests.tlscerts import Ca  # noqa: E402

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def http_once(port: int, ctx: ssl.SSLContext | None) -> float:
    t0 = time.perf_counter()
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1") if ctx is not None else raw
    try:
        sock.sendall(LIVE)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer {data[:60]!r}")
    return time.perf_counter() - t0


def grpc_once(port: int, ca: bytes | None) -> float:
    t0 = time.perf_counter()
    target = f"127.0.0.1:{port}"
    channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))
               if ca is not None else grpc.insecure_channel(target))
    try:
        live = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(
            grpc_service_pb2.ServerLiveRequest(), timeout=10)
    finally:
        channel.close()
    if not live.live:
        raise RuntimeError("not live")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    tmp = Path(tempfile.mkdtemp(prefix="tls_handshake_"))
    ca = Ca(tmp, "bench")
    server = ca.issue("server", "bench-server", server=True)
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    repo = os.path.join(ROOT, "models")
    sides = {}
    for tls in (False, True):
        ports = {"http": free_port(), "grpc": free_port()}
        env = {"AIENG_OIP_HTTP_ADDR": f"127.0.0.1:{ports['http']}",
               "AIENG_OIP_GRPC_ADDR": f"127.0.0.1:{ports['grpc']}"}
        if tls:
            env.update(AIENG_OIP_TLS_CERT_FILE=str(server.cert), AIENG_OIP_TLS_KEY_FILE=str(server.key))
        proc, _, _ = start_server("tabular", repo, env)
        sides["tls" if tls else "plain"] = (proc, ports)
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for label, (_, ports) in sides.items():
                tls = label == "tls"
                for _ in range(args.connections):
                    times.setdefault((label, "http"), []).append(
                        http_once(ports["http"], ctx if tls else None))
                for _ in range(args.connections):
                    times.setdefault((label, "grpc"), []).append(
                        grpc_once(ports["grpc"], ca.cert.read_bytes() if tls else None))
    finally:
        for proc, _ in sides.values():
            stop_server(proc)
    print("| door | TLS | new connections | p50 ms | p90 ms |")
    print("|---|---|---:|---:|---:|")
    p50 = {}
    for (label, door), ts in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ts = sorted(ts)
        p50[(label, door)] = statistics.median(ts) * 1000
        print(f"| {door} | {'on' if label == 'tls' else 'off'} | {len(ts)} | {p50[(label, door)]:.2f} | "
              f"{ts[int(len(ts) * 0.9)] * 1000:.2f} |")
    for door in ("http", "grpc"):
        extra = p50[("tls", door)] - p50[("plain", door)]
        print(f"{door}: a new connection costs {extra:+.2f} ms with TLS (p50)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
