"""``aieng bench --against OTHER``: a model beside another that answers the same inputs, in one run.

For a model whose pre- and postprocessing are a team's own Python beside the built-in model it rewrites
(issue 36: ``examples/penguins`` beside ``tabular``), or any two versions of one job.  Two servers, one
serving ``--model`` from the repository (``AIENG_MODEL_REPOSITORY``), the other ``--against`` from
``--against-repo`` (default: the same repository), are loaded with the same inputs (made for ``--model``)
at each concurrency in ``ROUNDS`` interleaved rounds (``rounds.closed_rounds``), so a shared machine's
drift falls on both alike.  Writes ``<out>/<model>-against-<other>.md``: per level each side's req/s and
their ratio (over all rounds, and round by round: how far one round's pair strays), p50 and the difference,
p99, the answers' mean batch, CPU ms per request and errors; CPU per process; each side's per-hop p50s at
the lowest level (``kit.HOPS``).  A model with its own code loads only
with ``AIENG_ALLOW_MODEL_CODE=1`` in the bench's environment (passed to both servers).
"""
from __future__ import annotations

import os
import time

import numpy as np

from aieng.tools import checks
from aieng.tools.bench.kit import HOPS, fmt_num, hop_values, ratio, start_server, stop_server, write_report
from aieng.tools.bench.rounds import ROUNDS, Side, closed_rounds
from aieng.tools.loadgen import sample_inputs


def measure(model: str, repo: str, other: str, other_repo: str, inputs: list[dict], levels: list[int],
            n: int, rounds: int) -> dict[str, list[dict]]:
    """Both servers started, then measured side by side: per model one row per level."""
    procs = []
    try:
        proc, addr, _ = start_server(model, repo)
        procs.append(proc)
        oproc, oaddr, _ = start_server(other, other_repo)
        procs.append(oproc)
        labels = (model, other)  # the same name twice: told apart by repository, else as a and b
        if other == model:
            labels = (f"{model} ({repo})", f"{other} ({other_repo})") if repo != other_repo else (
                f"{model} (a)", f"{other} (b)")
        sides = {labels[0]: Side(addr, proc.pid, report=True),
                 labels[1]: Side(oaddr, oproc.pid, report=True, model=other)}
        return closed_rounds(sides, model, inputs, levels, n, rounds)
    finally:
        for p in procs:
            stop_server(p)


def hop_p50s(level: dict) -> list[float | None]:
    """The p50 (us) of each step of ``kit.HOPS`` over a level's answers (None without them)."""
    return [float(np.percentile(v, 50)) if v else None for v in hop_values(level)]


def by_round(x: dict, y: dict) -> str:
    """Each round's req/s ratio, in order (the rounds' spread: one run's noise), or "-" without them."""
    pairs = list(zip(x.get("round_rps") or (), y.get("round_rps") or ()))
    return " ".join(fmt_num(ratio(p, q)) for p, q in pairs) or "-"


def fmt_against(a: str, b: str, rows: dict[str, list[dict]], n: int, rounds: int) -> str:
    """The report: ``a`` measured beside ``b`` (ratios are a over b)."""
    ra, rb = rows[a], rows[b]
    lines = [f"# aieng bench: {a} against {b}", "",
             f"Two servers, the same inputs, {n} requests per level in {rounds} interleaved rounds; ratios "
             f"and differences are {a} over (minus) {b}.", "",
             f"| concurrency | {a} req/s | {b} req/s | req/s ratio | ratio by round | {a} p50 ms | "
             f"{b} p50 ms | p50 difference ms | {a} p99 ms | {b} p99 ms | {a} mean batch | {b} mean batch | "
             f"{a} CPU ms/req | {b} CPU ms/req | errors |", "|---:|" + "---:|" * 13 + "---|"]
    for x, y in zip(ra, rb):
        errors = "; ".join(f"{k}: " + ", ".join(f"{code} {count}" for code, count in e.items())
                           for k, e in ((a, x["errors"]), (b, y["errors"])) if e) or "-"
        lines.append(f"| {x['concurrency']} | {x['rps']:.1f} | {y['rps']:.1f} | "
                     f"{fmt_num(ratio(x['rps'], y['rps']))} | {by_round(x, y)} | {x['p50_ms']:.2f} | "
                     f"{y['p50_ms']:.2f} | "
                     f"{x['p50_ms'] - y['p50_ms']:+.2f} | {x['p99_ms']:.2f} | {y['p99_ms']:.2f} | "
                     f"{x['mean_batch']:.2f} | {y['mean_batch']:.2f} | {x['cpu']['total']:.3f} | "
                     f"{y['cpu']['total']:.3f} | {errors} |")
    lines += ["", "CPU ms per answered request, per process:", "", "| concurrency | model | per process |",
              "|---:|---|---|"]
    for x, y in zip(ra, rb):
        for label, r in ((a, x), (b, y)):
            per = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["cpu"].items()) if k != "total")
            lines.append(f"| {r['concurrency']} | {label} | {per} |")
    low_a, low_b = ra[0], rb[0]
    pa, pb = hop_p50s(low_a), hop_p50s(low_b)
    if any(v is not None for v in pa + pb):
        lines += ["", f"Where each microsecond goes at concurrency {low_a['concurrency']} (p50 of each step "
                      "over the answers' timings):", "", f"| step | {a} us | {b} us | difference us |",
                  "|---|---:|---:|---:|"]
        for (name, _, _), va, vb in zip(HOPS, pa, pb):
            diff = "-" if va is None or vb is None else f"{va - vb:+.0f}"
            lines.append(f"| {name} | {fmt_num(va, 0)} | {fmt_num(vb, 0)} | {diff} |")
    return "\n".join(lines) + "\n"


def main_against(args) -> int:
    from aieng.config import load_config

    repo = load_config().model_repository
    other_repo = args.against_repo or repo
    if not os.path.isdir(os.path.join(other_repo, args.against)):
        raise checks.UsageError(f"--against: no model directory {args.against!r} in {other_repo}")
    levels = checks.levels(str(args.concurrency))
    n = min(args.requests, 60) if args.quick else args.requests
    rounds = 1 if args.quick else ROUNDS
    inputs = sample_inputs(args.model, max(n, 64), repo=repo, shapes=getattr(args, "shape", None))
    t0 = time.monotonic()
    print(f"bench {args.model} against {args.against}: levels {levels}, {n} requests/level", flush=True)
    rows = measure(args.model, repo, args.against, other_repo, inputs, levels, n, rounds)
    a, b = list(rows)
    text = fmt_against(a, b, rows, n, rounds)
    print(text, flush=True)
    name = f"{args.model}-against-{args.against}.md"
    print(f"wrote {write_report(args.out, name, text)} ({time.monotonic() - t0:.0f} s)")
    return 0
