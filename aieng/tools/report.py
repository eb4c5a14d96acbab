"""``aieng report``: the pipeline-stage timing report of a running server.

Asks the frontend's ``stats`` op for per-request stage durations and prints,
per model, p50/p95/p99/mean and each stage's share of the total, plus the
batch-size distribution and padding waste, and each postprocess step's time
(a breakdown of ``postprocess``) with how often it ran past its limit:
``skipped`` (answered without it) and ``timeout`` (the request failed).  ``--since S`` covers the last S
seconds, ``--reset`` starts a new window after reading, ``--png FILE`` draws a
stacked bar per model (mean microseconds per stage), after the table (the ``plots`` extra: ``plots.py``).
A reset changes the window for everyone, so it is an admin operation: with ``--reset`` the request goes to
the admin socket's ``stats`` op (``--admin-addr``; ``aieng report`` finds it as ``aieng rollout`` does), not
the client socket (which refuses it unless ``AIENG_CLIENT_ADMIN_OPS``).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

from aieng.client import Client
from aieng.tools.checks import reachable
from aieng.tools.plots import pyplot


def fetch(addr: str | None, since_s: float | None = None, reset: bool = False,
          timeout_s: float = 10.0, admin_addr: str | None = None) -> dict:
    """The ``stats`` reply; a reset goes to ``admin_addr`` when given (else to the client socket, which
    serves it only with ``AIENG_CLIENT_ADMIN_OPS``)."""
    req: dict[str, Any] = {"op": "stats", "id": "report", "reset": reset}
    if since_s:
        req["since_s"] = since_s
    with Client(admin_addr if reset and admin_addr else addr, timeout_s=timeout_s) as c:
        return c.call(req)


def render(stats: dict) -> str:
    lines = []
    for model, data in sorted(stats.get("models", {}).items()):
        if not data["requests"]:  # every request of the window failed at a postprocess step
            lines.append(f"## {model}: no answered requests")
            lines.append("")
            lines.extend(render_steps(data.get("steps_us", {})))
            continue
        lines.append(f"## {model}: {data['requests']} requests over {data['seconds']:.1f}s, "
                     f"mean batch {data['mean_batch']:.2f}, padding waste {100 * data['padding_waste']:.1f}%")
        lines.append("")
        lines.append("| stage | p50 ms | p95 ms | p99 ms | mean ms | share |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for stage in list(stats["stages"]) + ["total"]:
            s = data["stages_us"][stage]
            lines.append(f"| {stage} | {s['p50'] / 1000:.3f} | {s['p95'] / 1000:.3f} | "
                         f"{s['p99'] / 1000:.3f} | {s['mean'] / 1000:.3f} | {100 * s['share']:.1f}% |")
        by_size = sorted(data["batch_sizes"].items(), key=lambda kv: int(kv[0]))
        sizes = ", ".join(f"{k}: {v}" for k, v in by_size)
        lines.append("")
        lines.append(f"batch sizes (requests per size): {sizes}")
        lines.append("")
        lines.extend(render_steps(data.get("steps_us", {})))
    if not lines:
        lines.append("no answered requests in this window")
    return "\n".join(lines)


def render_steps(steps: dict) -> list[str]:
    """The postprocess steps' table: time per run, and the runs past the step's limit."""
    if not steps:
        return []
    lines = ["| postprocess step | runs | p50 ms | p95 ms | mean ms | skipped | timeout |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in steps.items():
        lines.append(f"| {name} | {s['runs']} | {s['p50'] / 1000:.3f} | {s['p95'] / 1000:.3f} | "
                     f"{s['mean'] / 1000:.3f} | {s['skipped']} | {s['timeout']} |")
    return lines + [""]


def plot(stats: dict, path: str) -> None:
    plt = pyplot()
    models = sorted(m for m, data in stats.get("models", {}).items() if data["requests"])
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.8 * max(1, len(models))))
    for row, model in enumerate(models):
        left = 0.0
        for i, stage in enumerate(stats["stages"]):
            width = stats["models"][model]["stages_us"][stage]["mean"] / 1000
            ax.barh(row, width, left=left, color=f"C{i}", label=stage if row == 0 else None)
            left += width
    ax.set_yticks(range(len(models)), models)
    ax.set_xlabel("mean milliseconds per request")
    ax.set_title("aieng: where each millisecond goes")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, off the axis label
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_report(args) -> int:
    if args.png and not os.path.isdir(os.path.dirname(os.path.abspath(args.png))):
        raise FileNotFoundError(2, "no such directory for the PNG", args.png)
    reachable(args.addr)
    stats = fetch(args.addr, args.since, args.reset, args.timeout, args.admin_addr)
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print(render(stats))
    if args.png:
        plot(stats, args.png)
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover - also runnable as a script
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--addr")
    ap.add_argument("--since", type=float)
    ap.add_argument("--reset", action="store_true")
    ap.add_argument("--admin-addr")
    ap.add_argument("--png")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--timeout", type=float, default=10.0)
    sys.exit(main_report(ap.parse_args()))
