"""``aieng bench --tracing``: what exporting spans costs, side by side in one run.

Three servers of one model, each in ``ROUNDS`` interleaved rounds per concurrency (load from elsewhere
falls on each alike): ``off`` (no OTLP endpoint: nothing exported), ``sampled`` (the default sampler,
parent-based at ``--trace-ratio``, exporting to a loopback OTLP/HTTP receiver this bench runs,
``otlp_sink``) and ``gone`` (the same sampler, an endpoint nobody listens on: every export fails, its
spans are dropped and counted).  Writes ``<out>/<model>-tracing.md``: req/s and p50 beside ``off``, spans
received and dropped.
"""
from __future__ import annotations

import asyncio
import urllib.request

from aieng.tools.bench.kit import fmt_num, free_port, ratio, start_server, stop_server, write_report
from aieng.tools.loadgen import Progress, merge_levels, run_level, sample_inputs
from aieng.tools.otlp_sink import Collector

ROUNDS = 3
VARIANTS = ("off", "sampled", "gone")
OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_SAMPLER",
             "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME")


def metric(http: str, name: str) -> float:
    """The sum of a counter's samples on a server's /metrics (0 when it has none)."""
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def tracing_side(model: str, repo: str, inputs: list[dict], levels: list[int], n: int,
                 trace_ratio: float) -> tuple[list[dict], dict]:
    sink = Collector(keep=0)
    closed = f"http://127.0.0.1:{free_port()}"  # nobody listens: every export fails
    base = {k: "" for k in OTEL_VARS}  # the caller's OTEL_* never leak into a variant
    endpoints = {"off": "", "sampled": sink.endpoint, "gone": closed}
    servers: dict[str, tuple] = {}
    rows: list[dict] = []
    try:
        for v in VARIANTS:
            http = f"127.0.0.1:{free_port()}"
            env = {**base, "AIENG_HTTP_ADDR": http, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoints[v]}
            if v != "off":
                env.update({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                            "OTEL_TRACES_SAMPLER_ARG": str(trace_ratio)})
            proc, addr, _ = start_server(model, repo, env)
            servers[v] = (proc, addr, http)
        per_round = max(1, n // ROUNDS)
        for c in levels:
            for v in VARIANTS:  # warm each at this level first
                asyncio.run(run_level(servers[v][1], model, inputs[:min(len(inputs), 4 * c)], c, 60))
            parts: dict[str, list[dict]] = {v: [] for v in VARIANTS}
            for k in range(ROUNDS):
                for v in VARIANTS:
                    progress = Progress(f"{v} c={c} round {k + 1}/{ROUNDS}", per_round)
                    chunk = [inputs[(k * per_round + i) % len(inputs)] for i in range(per_round)]
                    parts[v].append(asyncio.run(run_level(servers[v][1], model, chunk, c, 60, "zmq",
                                                          progress)))
                    progress.close()
            for v in VARIANTS:
                r = merge_levels(parts[v])
                r["variant"] = v
                print(f"{v} c={c}: {r['rps']:.1f} req/s, p50 {r['p50_ms']:.2f} ms, "
                      f"errors {r['errors'] or '-'}", flush=True)
                rows.append(r)
        spans = {"received": sink.count,
                 "dropped_sampled": metric(servers["sampled"][2], "aieng_trace_spans_dropped_total"),
                 "dropped_gone": metric(servers["gone"][2], "aieng_trace_spans_dropped_total")}
    finally:
        for proc, _, _ in servers.values():
            stop_server(proc)
        sink.close()
    return rows, spans


def fmt_tracing(model: str, rows: list[dict], spans: dict, n: int, trace_ratio: float) -> str:
    lines = [f"# aieng bench --tracing: {model}", "",
             f"Three servers, {n} requests per row in {ROUNDS} interleaved rounds: off (no OTLP endpoint), "
             f"sampled (parent-based {trace_ratio:g} to a loopback OTLP/HTTP receiver) and gone (the same "
             "sampler, an endpoint nobody listens on). Requests carry no traceparent, so the ratio decides.",
             "", "| concurrency | variant | req/s | vs off | p50 ms | p50 - off | p99 ms | errors |",
             "|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        off = next(x for x in rows if x["concurrency"] == r["concurrency"] and x["variant"] == "off")
        lines.append(f"| {r['concurrency']} | {r['variant']} | {r['rps']:.1f} | "
                     f"{fmt_num(ratio(r['rps'], off['rps']))} | {r['p50_ms']:.2f} | "
                     f"{r['p50_ms'] - off['p50_ms']:+.2f} | {r['p99_ms']:.2f} | {r['errors'] or '-'} |")
    lines += ["", f"Spans received by the sink: {spans['received']}; dropped (counted by the server): "
                  f"sampled {spans['dropped_sampled']:g}, gone {spans['dropped_gone']:g}."]
    return "\n".join(lines) + "\n"


def main_tracing(args) -> int:
    from aieng.config import load_config

    repo = load_config().model_repository
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    n = min(args.requests, 60) if args.quick else args.requests
    inputs = sample_inputs(args.model, max(n, 64), repo=repo)
    rows, spans = tracing_side(args.model, repo, inputs, levels, n, args.trace_ratio)
    text = fmt_tracing(args.model, rows, spans, n, args.trace_ratio)
    print(text, flush=True)
    print(f"wrote {write_report(args.out, f'{args.model}-tracing.md', text)}")
    return 0
