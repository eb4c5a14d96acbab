"""``aieng bench --transport zmq,http,grpc``: the same closed loop over each front door of one server.

One server with the OIP gateway on; at each concurrency the closed loop runs over each listed
transport in ``ROUNDS`` interleaved rounds (so load from elsewhere on a shared machine falls on every
transport alike), merged per transport, with the server's CPU per request per process; writes
``<out>/<model>-transports.md``.  With ``--tls-cert/--tls-key/--tls-ca`` the server's OIP doors speak TLS
(AIENG_OIP_TLS_CERT_FILE/KEY_FILE) and the http and grpc loads trust the CA: run it with and without them
for TLS's cost (the certificate must name 127.0.0.1).
"""
from __future__ import annotations

from aieng.tools import checks
from aieng.tools.bench.kit import fmt_num, free_port, ratio, start_server, stop_server, write_report
from aieng.tools.bench.rounds import ROUNDS, Side, closed_rounds
from aieng.tools.loadgen import sample_inputs

TRANSPORTS = ("zmq", "http", "grpc")


def transport_side(model: str, repo: str, inputs: list[dict], levels: list[int], n: int,
                   transports: list[str], tls: tuple[str, str, str] | None = None) -> list[dict]:
    """One server with the gateway on; at each level the same closed loop over each transport, in
    ``ROUNDS`` interleaved rounds (``rounds.closed_rounds``), merged per transport."""
    ports = {"http": f"127.0.0.1:{free_port()}", "grpc": f"127.0.0.1:{free_port()}"}
    env = {"AIENG_OIP_HTTP_ADDR": ports["http"], "AIENG_OIP_GRPC_ADDR": ports["grpc"]}
    if tls is not None:
        env.update(AIENG_OIP_TLS_CERT_FILE=tls[0], AIENG_OIP_TLS_KEY_FILE=tls[1])
    proc, addr, _ = start_server(model, repo, env)
    door = {"zmq": addr, **ports}
    try:
        sides = {t: Side(door[t], proc.pid, transport=t, tls_ca=None if tls is None or t == "zmq" else tls[2])
                 for t in transports}
        out = closed_rounds(sides, model, inputs, levels, n, ROUNDS)
    finally:
        stop_server(proc)
    rows = [out[t][i] for i in range(len(levels)) for t in transports]
    for r in rows:
        print(f"{r['transport']} c={r['concurrency']}: {r['rps']:.1f} req/s, p50 {r['p50_ms']:.2f} ms, "
              f"errors {r['errors'] or '-'}", flush=True)
    return rows


def _cpu_of(r: dict, role: str) -> float:
    return sum(v for k, v in r["cpu"].items() if k.startswith(role))


def fmt_transports(model: str, rows: list[dict], n: int) -> str:
    lines = [f"# aieng bench --transport: {model}", "",
             f"One server (the OIP gateway on, {n} requests per row); at each concurrency the same closed "
             f"loop over each front door, in {ROUNDS} interleaved rounds merged per door. zmq: the native "
             "protocol (AsyncClient); http: OIP REST with binary tensors both ways (one keep-alive "
             "connection per client worker); grpc: OIP GRPCInferenceService (one channel). CPU ms/req: the "
             "server's processes only (the client shares the machine).", "",
             "| concurrency | transport | req/s | vs zmq | p50 ms | p50 - zmq p50 | p95 ms | p99 ms "
             "| server CPU ms/req | gateway | frontend | errors |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        z = next((x for x in rows if x["concurrency"] == r["concurrency"] and x["transport"] == "zmq"), None)
        rel = fmt_num(ratio(r["rps"], z and z["rps"]))
        dp50 = "-" if z is None else f"{r['p50_ms'] - z['p50_ms']:+.2f}"
        lines.append(f"| {r['concurrency']} | {r['transport']} | {r['rps']:.1f} | {rel} | "
                     f"{r['p50_ms']:.2f} | {dp50} | {r['p95_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['cpu']['total']:.2f} | {fmt_num(_cpu_of(r, 'gateway'))} | "
                     f"{fmt_num(_cpu_of(r, 'frontend'))} | {r['errors'] or '-'} |")
    return "\n".join(lines) + "\n"


def tls_files(args) -> tuple[str, str, str] | None:
    """``--tls-cert``, ``--tls-key``, ``--tls-ca``: all three or none."""
    files = (getattr(args, "tls_cert", None), getattr(args, "tls_key", None), getattr(args, "tls_ca", None))
    if not any(files):
        return None
    if not all(files):
        raise checks.UsageError("--tls-cert, --tls-key and --tls-ca go together (the server's certificate "
                                "and key, the CA its clients trust)")
    return files  # type: ignore[return-value]


def main_transports(args, transports: list[str]) -> int:
    from aieng.config import load_config

    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    n_req = min(args.requests, 60) if args.quick else args.requests
    repo = load_config().model_repository
    inputs = sample_inputs(args.model, max(n_req, 64), repo=repo, shapes=getattr(args, "shape", None))
    print(f"bench {args.model} over {', '.join(transports)}: levels {levels}, {n_req} requests per row",
          flush=True)
    rows = transport_side(args.model, repo, inputs, levels, n_req, transports, tls_files(args))
    text = fmt_transports(args.model, rows, n_req)
    md = write_report(args.out, f"{args.model}-transports.md", text)
    print(text)
    print(f"wrote {md}")
    return 0
