"""``aieng tune MODEL``: measure a small grid of settings on this machine; write the best as a config file.

The defaults were found on a 2-core machine; a bigger one wants other lanes and worker counts.  The
search is coordinate-wise: start from this machine's defaults, then vary one setting at a time
(``axes``), keeping a value only when it beats the best row so far.  Each row is a real server
with those settings (``bench.kit.start_server``), warmed, then a closed loop at concurrency 1 (p50) and
at ``--concurrency`` (throughput, the score).  A live progress line runs through every row.

The written YAML holds ``Config`` field names (``aieng serve --config FILE``; ``aieng config
--config FILE`` shows each value's source) and, as comments, the measured table.  The best
settings are measured once more at the end, so the file's figure is a fresh one beside the best
row's (on a shared machine they differ by its noise; ``aieng bench`` is the place for ratios).
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aieng import envs
from aieng.tools.loadgen import Progress, run_level, sample_inputs

ENV_OF = {v.field: v.name for v in envs.REGISTRY}


@dataclass
class Row:
    settings: dict[str, Any]
    c1_p50_ms: float = 0.0
    c1_rps: float = 0.0
    rps: float = 0.0  # at the saturating concurrency: the score
    p99_ms: float = 0.0
    errors: dict = field(default_factory=dict)


def axes(cpus: int, max_batch: int) -> list[tuple[tuple[str, ...], list[tuple]]]:
    """The settings varied, in order, each with its candidate values on a machine of ``cpus`` usable CPUs.
    Lanes move together with the threads that fill the machine (2 lanes x 1 thread, 1 x 2, ...); the
    threads per lane are then tried on their own."""
    upto = sorted({1, 2, 4, 8, 16, cpus} & set(range(1, cpus + 1)))
    return [
        (("executor_lanes", "intra_op_threads"), [(n, max(1, cpus // n)) for n in upto]),
        (("intra_op_threads",), [(n,) for n in upto]),
        (("idle_wide_spinning",), [(False,), (True,)]),
        (("worker_sched_batch",), [(False,), (True,)]),
        (("preprocess_workers",), [(n,) for n in upto]),
        (("max_batch_size",), [(n,) for n in sorted({max_batch, min(8, max_batch)})]),
    ]


def defaults(cpus: int, max_batch: int) -> dict[str, Any]:
    lanes = max(1, min(4, cpus))
    return {"executor_lanes": lanes, "intra_op_threads": max(1, cpus // lanes),
            "idle_wide_spinning": envs.BY_FIELD["idle_wide_spinning"].default_value(),
            "worker_sched_batch": envs.BY_FIELD["worker_sched_batch"].default_value(),
            "preprocess_workers": max(1, min(4, cpus)), "max_batch_size": max_batch}


def valid(s: dict[str, Any], cpus: int) -> bool:
    """More intra-op threads side by side than CPUs only oversubscribes."""
    return s["executor_lanes"] * s["intra_op_threads"] <= cpus


def as_env(settings: dict[str, Any]) -> dict[str, str]:
    return {ENV_OF[k]: (("true" if v else "false") if isinstance(v, bool) else str(v))
            for k, v in settings.items()}


def measure(model: str, repo: str, settings: dict[str, Any], inputs: list[dict], n: int,
            concurrency: int, label: str) -> Row:
    from aieng.tools.bench.kit import start_server, stop_server

    proc, addr, _log = start_server(model, repo, as_env(settings))
    row = Row(dict(settings))
    try:
        asyncio.run(run_level(addr, model, inputs[:min(len(inputs), 4 * concurrency)], concurrency, 60))
        for c in (1, concurrency):
            progress = Progress(f"{label} c={c}", n)
            r = asyncio.run(run_level(addr, model, inputs[:n], c, 60, progress=progress))
            progress.close()
            for code, k in r["errors"].items():
                row.errors[code] = row.errors.get(code, 0) + k
            if c == 1:
                row.c1_p50_ms, row.c1_rps = r["p50_ms"], r["rps"]
            if c == concurrency:
                row.rps, row.p99_ms = r["rps"], r["p99_ms"]
    finally:
        stop_server(proc)
    return row


def search(model: str, repo: str, cpus: int, max_batch: int, inputs: list[dict], n: int,
           concurrency: int, budget: int) -> tuple[list[Row], Row]:
    """Coordinate search from the defaults, at most ``budget`` rows; returns every row and the best."""
    best = measure(model, repo, defaults(cpus, max_batch), inputs, n, concurrency, "row 1 (defaults)")
    rows = [best]
    print(_line(best), flush=True)
    for names, values in axes(cpus, max_batch):
        for value in values:
            cand = {**best.settings, **dict(zip(names, value))}
            if cand == best.settings or not valid(cand, cpus) or any(r.settings == cand for r in rows):
                continue
            if len(rows) >= budget:
                return rows, best
            what = ", ".join(f"{k}={v}" for k, v in zip(names, value))
            row = measure(model, repo, cand, inputs, n, concurrency, f"row {len(rows) + 1} ({what})")
            rows.append(row)
            print(_line(row), flush=True)
            if not row.errors and row.rps > best.rps:
                best = row
    return rows, best


def _line(r: Row) -> str:
    s = ", ".join(f"{k}={v}" for k, v in r.settings.items())
    return (f"  {s}: {r.rps:.1f} req/s, p99 {r.p99_ms:.1f} ms; c=1 p50 {r.c1_p50_ms:.2f} ms"
            f"{'; errors ' + str(r.errors) if r.errors else ''}")


def table(rows: list[Row], best: Row, concurrency: int) -> list[str]:
    keys = list(rows[0].settings)
    lines = ["| " + " | ".join(keys) + f" | req/s at c={concurrency} | p99 ms | c=1 p50 ms | c=1 req/s | "
             "errors | best |", "|" + "---|" * (len(keys) + 6)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.settings[k]) for k in keys) +
                     f" | {r.rps:.1f} | {r.p99_ms:.1f} | {r.c1_p50_ms:.2f} | {r.c1_rps:.1f} | "
                     f"{r.errors or '-'} | {'**yes**' if r is best else ''} |")
    return lines


def write_config(path: str, model: str, best: Row, lines: list[str], confirm: Row) -> None:
    import yaml

    share = confirm.rps / max(best.rps, 1e-9)
    head = [f"# aieng tune {model} on this machine ({envs.cpu_count()} usable CPUs), "
            f"{time.strftime('%Y-%m-%d %H:%M')}", "#"] + [f"# {x}" for x in lines] + [
        "#", f"# these settings measured again: {confirm.rps:.1f} req/s ({share:.2f} of the best row's "
        f"{best.rps:.1f}), c=1 p50 {confirm.c1_p50_ms:.2f} ms",
        "# serve with: aieng serve --config THIS_FILE"]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(head) + "\n" + yaml.safe_dump(best.settings, sort_keys=False))


def main_tune(args) -> int:
    from aieng.config import load_config
    from aieng.models.repo import load_spec

    cfg = load_config()
    repo = cfg.model_repository
    mdir = os.path.join(repo, args.model)
    versions = sorted((v for v in os.listdir(mdir) if os.path.isfile(os.path.join(mdir, v, "model.onnx"))),
                      key=lambda v: (len(v), v)) if os.path.isdir(mdir) else []
    if not versions:
        print(f"aieng tune: no model {args.model!r} with a version under {repo}", file=sys.stderr)
        return 2
    spec = load_spec(args.model, versions[-1], os.path.join(mdir, versions[-1]), cfg.allow_model_code)
    max_batch = int(spec.batching.max_batch_size)
    cpus = envs.cpu_count()
    inputs = sample_inputs(args.model, max(args.requests, 4 * args.concurrency), repo=repo)
    print(f"tune {args.model}: {cpus} usable CPUs, {args.requests} requests per level, c=1 and "
          f"c={args.concurrency}, at most {args.rows} rows", flush=True)
    rows, best = search(args.model, repo, cpus, max_batch, inputs, args.requests, args.concurrency, args.rows)
    confirm = measure(args.model, repo, best.settings, inputs, args.requests, args.concurrency,
                      "the best, again")
    lines = table(rows, best, args.concurrency)
    write_config(args.out, args.model, best, lines, confirm)
    print("\n".join(lines))
    print(f"best: {_line(best).strip()}")
    share = confirm.rps / max(best.rps, 1e-9)
    print(f"measured again: {confirm.rps:.1f} req/s ({share:.2f} of the best row)")
    print(f"wrote {args.out} (aieng serve --config {args.out})")
    return 0


def add_parser(sub) -> None:
    t = sub.add_parser("tune", help="measure a small grid of settings here; write the best as a config file")
    t.add_argument("model", help="model to tune for (its latest version in the repository)")
    t.add_argument("--requests", type=_positive, default=300, help="requests per closed-loop level")
    t.add_argument("--concurrency", type=_positive, default=32, help="the saturating level (the score)")
    t.add_argument("--rows", type=_positive, default=12, help="at most this many settings measured")
    t.add_argument("--out", default="aieng-tuned.yaml", help="config file to write")
    t.set_defaults(func=lambda a: main_tune(a))


def _positive(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n
