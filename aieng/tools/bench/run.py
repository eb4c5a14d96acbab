"""``aieng bench``: the server, the in-process limit and a plain baseline server, in one run.

1. The in-process limit (``limit``): the best a user could run in one process with the same files.
2. The aieng server (a subprocess serving only this model) and the baseline (``baseline``), spinning on
   and off (skip with ``--skip-baseline``), all running: at each concurrency the same closed loop in
   ``ROUNDS`` rounds, the servers taking turns within each, so drift falls on all alike; CPU per request
   from ``/proc`` (``runtime.cpuacct``), total and per process; at concurrency 1 a per-hop table.
3. The aieng server's open loop, Poisson arrivals at fractions of the limit.
4. The in-process limit again (drift check), and its CPU per request at the server's mean batch.

Writes ``<out>/<model>.md`` (the tables, printed first) and ``<out>/<model>.png`` (the ``plots`` extra;
without matplotlib one line says so).  Columns: BENCHMARKS.md, 'What `aieng bench` reports'.  Instead:
``--transport`` naming ``http`` or ``grpc`` the front doors (``transports``), ``--tracing`` what exporting
spans costs (``tracing``), ``--against MODEL`` the model beside another answering the same inputs
(``against``), ``--model ocr|layout`` a page model beside its package's pipeline (``ocr``, ``layout``).
Speed targets live here, never in tests.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Callable

import numpy as np

from aieng.tools import checks
from aieng.tools.bench.kit import (
    HOPS,
    free_addr,
    hop_values,
    ratio,
    spawn,
    start_server,
    stop_server,
    write_report,
)
from aieng.tools.bench.kit import fmt_num as _f
from aieng.tools.bench.limit import InProcess
from aieng.tools.bench.rounds import ROUNDS, Side, closed_rounds
from aieng.tools.bench.transports import TRANSPORTS, main_transports
from aieng.tools.loadgen import open_loop, sample_inputs
from aieng.tools.plots import MissingExtra, pyplot

# Column order of the per-process CPU table; names not listed follow, sorted.
_ROLE_ORDER = ("frontend", "preprocess", "executor", "postprocess", "supervisor", "other")


def start_baseline(model: str, repo: str, spinning: bool):
    """The plain one-process server (``aieng.tools.baseline``) with ONNX Runtime's intra-op spinning on (its
    default, what a user's script runs) or off: ``(proc, addr)``."""
    addr = free_addr()
    argv = [sys.executable, "-m", "aieng.tools.baseline", "--model", model, "--repo", repo, "--addr", addr,
            "--spinning", "on" if spinning else "off"]
    proc, _log = spawn("baseline", argv, dict(os.environ), addr, lambda h: bool(h.get("ready")))
    return proc, addr


def measured_sides(model: str, repo: str, inputs: list[dict], levels: list[int], rates: list[float],
                   duration: float, limit: float, n_requests: int, baseline: bool, rounds: int,
                   probe: Callable[[], float] | None = None) -> tuple[dict, dict | None, dict | None]:
    """The aieng server and (``baseline``) the two baselines, all started first and measured in
    interleaved rounds (``closed_rounds``); then the aieng server's open loop alone."""
    procs = []
    try:
        proc, addr, _log = start_server(model, repo)
        procs.append(proc)
        sides = {"aieng": Side(addr, proc.pid, report=True)}
        if baseline:
            for label, spinning in (("baseline", True), ("baseline spinning off", False)):
                bproc, baddr = start_baseline(model, repo, spinning)
                procs.append(bproc)
                sides[label] = Side(baddr, bproc.pid)
        closed = closed_rounds(sides, model, inputs, levels, n_requests, rounds, probe)
        opened = [asyncio.run(open_loop(addr, model, inputs, f * limit, duration, 60)) for f in rates]
    finally:
        for p in procs:
            stop_server(p)
    srv = {"closed": closed["aieng"], "open": opened}
    if not baseline:
        return srv, None, None
    return srv, {"closed": closed["baseline"]}, {"closed": closed["baseline spinning off"]}


def _role_columns(rows: list[dict]) -> list[str]:
    names = {k for r in rows for k in r["cpu"] if k != "total"}
    return sorted(names, key=lambda k: (next((i for i, p in enumerate(_ROLE_ORDER) if k.startswith(p)),
                                             len(_ROLE_ORDER)), k))


def fmt_inprocess(before: dict, after: dict, limit: float) -> list[str]:
    spin = after.get("by_spinning", {})
    best = {s: max((max(r["arrival"], r["sorted"] or 0) for r in before["rows"]
                    if r["spinning"] == s and not r.get("lanes")), default=None) for s in (False, True)}
    lines = [f"In-process limit (the best one process can do with the same model files: same processors, "
             f"session settings and padding): **{limit:.1f} req/s** (best row; best with intra-op spinning "
             f"off {_f(best[False], 1)}, on {_f(best[True], 1)}; before {before['best']:.1f}, "
             f"after {after['best']:.1f}: best row re-run with spinning off {_f(spin.get(False), 1)}, "
             f"on {_f(spin.get(True), 1)}, lanes {_f(spin.get('lanes'), 1)}); "
             f"batch-1 latency p50 {before['batch1_p50_ms']:.2f} ms; "
             f"batch 1 on one intra-op thread {_f(before.get('one_thread_batch1'), 1)} req/s; "
             f"best with lanes (threads side by side, one intra-op thread each) "
             f"{_f(before.get('best_lanes'), 1)} req/s.", "",
             "| batch | arrival, spinning off | sorted, spinning off | arrival, spinning on "
             "| sorted, spinning on | CPU ms/req (spinning off) | arrival, lanes | sorted, lanes "
             "| CPU ms/req (lanes) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["batch"], r["spinning"], bool(r.get("lanes"))): r for r in before["rows"]}
    for b in sorted({r["batch"] for r in before["rows"]}):
        off = by.get((b, False, False), {})
        on = by.get((b, True, False), {})
        ln = by.get((b, False, True), {})
        lines.append(f"| {b} | {_f(off.get('arrival'), 1)} | {_f(off.get('sorted'), 1)} | "
                     f"{_f(on.get('arrival'), 1)} | {_f(on.get('sorted'), 1)} | {_f(off.get('cpu_ms'))} | "
                     f"{_f(ln.get('arrival'), 1)} | {_f(ln.get('sorted'), 1)} | {_f(ln.get('cpu_ms'))} |")
    return lines


def fmt_closed(srv: list[dict], base: list[dict] | None, limit: float,
               base_off: list[dict] | None = None) -> list[str]:
    """aieng beside the baseline (spinning on, ONNX Runtime's default) and the spinning-off baseline."""
    lines = ["| concurrency | aieng req/s | ratio to limit | baseline req/s | aieng/baseline | p50 ms "
             "| baseline p50 ms | p50 - baseline p50 | baseline spinning off req/s | aieng/spinning off "
             "| p95 ms | p99 ms | p99/p50 | mean batch | CPU ms/req | padding waste | errors "
             "| limit in its rounds req/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    by_c = {r["concurrency"]: r for r in base or []}
    off_c = {r["concurrency"]: r for r in base_off or []}
    for r in srv:
        b, o = by_c.get(r["concurrency"]), off_c.get(r["concurrency"])
        rep = r.get("report") or {}
        waste = f"{100 * rep['padding_waste']:.1f}%" if "padding_waste" in rep else "-"
        dp50 = "-" if b is None else f"{r['p50_ms'] - b['p50_ms']:+.2f}"
        lim = r.get("round_limit") or limit  # the best row re-run in this level's rounds, when it was
        lines.append(f"| {r['concurrency']} | {r['rps']:.1f} | {_f(ratio(r['rps'], lim))} | "
                     f"{_f(b and b['rps'], 1)} | {_f(ratio(r['rps'], b and b['rps']))} | {r['p50_ms']:.2f} | "
                     f"{_f(b and b['p50_ms'])} | {dp50} | {_f(o and o['rps'], 1)} | "
                     f"{_f(ratio(r['rps'], o and o['rps']))} | "
                     f"{r['p95_ms']:.2f} | {r['p99_ms']:.2f} | {_f(ratio(r['p99_ms'], r['p50_ms']))} | "
                     f"{r['mean_batch']:.2f} | {r['cpu']['total']:.2f} | {waste} | {r['errors'] or '-'} | "
                     f"{_f(r.get('round_limit'), 1)} |")
    return lines


def fmt_hops(level: dict) -> list[str]:
    """Per-hop p50/p99 (us) of one closed-loop level (the bench prints concurrency 1's)."""
    rows = [t for t in level.get("hops", []) if "total" in t]
    if not rows:
        return []
    lines = [f"Where each microsecond goes at concurrency {level['concurrency']} ({len(rows)} answers; the "
             "frontend's stamps and the Trail's clock readings, CLOCK_MONOTONIC in every process):", "",
             "| step | kind | p50 us | p99 us |", "|---|---|---:|---:|"]
    hand = np.zeros(len(rows))
    for (name, kind, _), values in zip(HOPS, hop_values(level)):
        v = np.array(values)
        if kind == "hand-off":
            hand += v
        lines.append(f"| {name} | {kind} | {np.percentile(v, 50):.0f} | {np.percentile(v, 99):.0f} |")
    client = np.array([t["client"] for t in rows], dtype=float)
    lines.append(f"| all hand-offs | | {np.percentile(hand, 50):.0f} | {np.percentile(hand, 99):.0f} |")
    lines.append(f"| client latency | | {np.percentile(client, 50):.0f} | {np.percentile(client, 99):.0f} |")
    return lines


def fmt_cpu(srv: list[dict], base: list[dict] | None) -> list[str]:
    lines = ["| concurrency | mean batch | aieng CPU ms/req | in-process CPU ms/req at that batch | "
             "aieng minus in-process (target <= 1 ms) | baseline CPU ms/req |",
             "|---:|---:|---:|---:|---:|---:|"]
    by_c = {r["concurrency"]: r for r in base or []}
    for r in srv:
        b = by_c.get(r["concurrency"])
        inproc = r.get("inprocess_cpu_ms")
        diff = None if inproc is None else r["cpu"]["total"] - inproc
        lines.append(f"| {r['concurrency']} | {r['mean_batch']:.2f} | {r['cpu']['total']:.2f} | "
                     f"{_f(inproc)} | {'-' if diff is None else f'{diff:+.2f}'} | "
                     f"{_f(b and b['cpu']['total'])} |")
    cols = _role_columns(srv)
    lines += ["", "aieng CPU ms per answered request, per process:", "",
              "| concurrency | " + " | ".join(cols) + " | total |", "|---:|" + "---:|" * (len(cols) + 1)]
    for r in srv:
        lines.append(f"| {r['concurrency']} | " + " | ".join(_f(r["cpu"].get(k)) for k in cols)
                     + f" | {r['cpu']['total']:.2f} |")
    return lines


def fmt_table(model: str, before: dict, after: dict, srv: dict, base: dict | None, limit: float,
              base_off: dict | None = None) -> str:
    lines = [f"# aieng bench: {model}", ""] + fmt_inprocess(before, after, limit)
    beside = (" and baseline (one process, one session with ONNX Runtime's defaults, intra-op spinning on; "
              "thread pool, no batching, same transport; and the same with spinning off)")
    lines += ["", "Closed loop, aieng server" + (beside if base else "")
              + f", all running, in {srv['closed'][0].get('rounds', 1)} rounds per level taking turns"
              + " (after each round the in-process limit's best row runs again on its own inputs: the ratio"
              + " to limit is against their mean, the last column); latency, mean batch and CPU columns are"
              + " aieng's:", ""]
    lines += fmt_closed(srv["closed"], base and base["closed"], limit, base_off and base_off["closed"])
    c1 = next((r for r in srv["closed"] if r["concurrency"] == 1), None)
    hops = fmt_hops(c1) if c1 else []
    if hops:
        lines += [""] + hops
    lines += ["", "CPU per answered request (utime+stime from /proc of every server process, read around "
                  "each level; in-process: this process, batches sorted by length, spinning off):", ""]
    lines += fmt_cpu(srv["closed"], base and base["closed"])
    for name, b in (("spinning on", base), ("spinning off", base_off)):
        if not b:
            continue
        lines += ["", f"Baseline ({name}), closed loop:", "", "| concurrency | req/s | p50 ms | p95 ms | "
                  "p99 ms | CPU ms/req | errors |", "|---:|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {r['concurrency']} | {r['rps']:.1f} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | "
                  f"{r['p99_ms']:.2f} | {r['cpu']['total']:.2f} | {r['errors'] or '-'} |"
                  for r in b["closed"]]
    lines += ["", "aieng server, open loop (Poisson arrivals):", "",
              "| offered req/s | answered req/s | ratio to limit | p50 ms | p95 ms | p99 ms | errors |",
              "|---:|---:|---:|---:|---:|---:|---|"]
    for r in srv["open"]:
        lines.append(f"| {r['rate']:.1f} | {r['rps']:.1f} | {_f(ratio(r['rps'], limit))} | "
                     f"{r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors'] or '-'} |")
    c1 = next((r for r in srv["closed"] if r["concurrency"] == 1), None)
    if c1:
        lines += ["", f"p50 at concurrency 1 minus in-process batch-1 p50: "
                      f"{c1['p50_ms'] - before['batch1_p50_ms']:+.2f} ms"]
    return "\n".join(lines) + "\n"


def _plot(model: str, srv: dict, base: dict | None, limit: float, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["rps"] for r in srv["closed"]]
    for key, style in (("p50_ms", "o-"), ("p99_ms", "s--")):
        ax.plot(xs, [r[key] for r in srv["closed"]], style, label=f"aieng closed loop {key[:3]}")
    ax.plot([r["rps"] for r in srv["open"]], [r["p50_ms"] for r in srv["open"]], "^-",
            label="aieng open loop p50")
    if base:
        bx = [r["rps"] for r in base["closed"]]
        ax.plot(bx, [r["p50_ms"] for r in base["closed"]], "o-", color="black", alpha=0.6,
                label="baseline closed loop p50")
        ax.plot(bx, [r["p99_ms"] for r in base["closed"]], "s--", color="black", alpha=0.6,
                label="baseline closed loop p99")
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

    transports = [t.strip() for t in str(getattr(args, "transport", "zmq")).split(",") if t.strip()]
    unknown = [t for t in transports if t not in TRANSPORTS]
    if unknown or not transports:
        raise checks.UsageError(f"--transport: unknown {unknown or transports} "
                         f"(a comma-separated list of zmq, http, grpc)")
    if transports != ["zmq"]:
        return main_transports(args, transports)
    if getattr(args, "against", None):
        if getattr(args, "tracing", False):
            raise checks.UsageError("--against and --tracing are two different benches: give one")
        from aieng.tools.bench.against import main_against

        return main_against(args)
    if getattr(args, "against_repo", None):
        raise checks.UsageError("--against-repo goes with --against MODEL")
    if getattr(args, "tracing", False):
        if not 0.0 <= args.trace_ratio <= 1.0:
            raise checks.UsageError(f"--trace-ratio is a share between 0 and 1, got {args.trace_ratio!r}")
        from aieng.tools.bench.tracing import main_tracing

        return main_tracing(args)
    if args.model == "ocr":  # a pipeline: beside rapidocr's own pipeline instead of an in-process limit
        from aieng.tools.bench.ocr import main_ocr

        return main_ocr(args)
    if args.model == "layout":  # beside rapid_layout's own pipeline, as ocr beside rapidocr's
        from aieng.tools.bench.layout import main_layout

        return main_layout(args)
    cfg = load_config()
    repo = cfg.model_repository
    threads = cfg.intra_op_threads or cpu_count()
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    rates = [float(x) for x in str(args.rates).split(",") if x]
    n_req = min(args.requests, 60) if args.quick else args.requests
    duration = min(args.duration, 2.0) if args.quick else args.duration
    # Per in-process row: half a closed-loop level keeps the whole run near its old length
    # although every row is now measured with spinning off and on.
    n_inproc = 48 if args.quick else max(64, n_req // 2)
    inputs = sample_inputs(args.model, max(n_req, 64 if args.quick else 400), repo=repo,
                           shapes=getattr(args, "shape", None))
    t_start = time.monotonic()
    print(f"bench {args.model}: {len(inputs)} inputs, levels {levels}, {n_req} requests/level, "
          f"{n_inproc} per in-process row, threads {threads}", flush=True)
    inproc = InProcess(args.model, repo, inputs, threads, row_seconds=1.5 if args.quick else 5.0)
    before = inproc.limit(n_inproc)
    print(f"in-process limit (before): {before['best']:.1f} req/s", flush=True)
    # the best row again after each round, on the inputs its table row ran (a round's share is too few for
    # big batches on two lanes: 100 texts in batches of 16 left one lane idle at the end)
    best, table_inputs = inproc.best_config(before), inproc.orders(n_inproc)[0]
    srv, base, base_off = measured_sides(args.model, repo, inputs, levels, rates, duration, before["best"],
                                         n_req, not args.skip_baseline, 1 if args.quick else ROUNDS,
                                         lambda: inproc.rerun(best, table_inputs))
    print("servers done", flush=True)
    after = inproc.recheck(before, n_inproc)
    # CPU per request in process at a batch size: the cheapest configuration measured there (lanes
    # when measured: the executor's own way of running), so the gap printed is not flattered.
    cache: dict[int, float] = {}
    for r in before["rows"]:
        if not r["spinning"]:
            cache[r["batch"]] = min(cache.get(r["batch"], r["cpu_ms"]), r["cpu_ms"])
    for r in srv["closed"]:
        r["inprocess_cpu_ms"] = inproc.cpu_at(r["mean_batch"], n_inproc, cache)
    limit = max(before["best"], after["best"])
    text = fmt_table(args.model, before, after, srv, base, limit, base_off)
    publish(args.out, args.model, text, lambda path: _plot(args.model, srv, base, limit, path))
    print(f"({time.monotonic() - t_start:.0f} s)")
    return 0


def publish(out: str, model: str, text: str, draw: Callable[[str], None]) -> None:
    """Write and print the tables, then ``draw`` the plot into ``<out>/<model>.png``: the table first, so
    without the plots extra only the plot is lost (one line on stderr says so)."""
    md = write_report(out, f"{model}.md", text)
    print(text, flush=True)
    png = os.path.join(out, f"{model}.png")
    try:
        draw(png)
    except MissingExtra as exc:
        print(f"aieng bench: {exc}", file=sys.stderr)
        print(f"wrote {md}")
        return
    print(f"wrote {md} and {png}")
