"""Profile every server process with py-spy while a page model (ocr, layout) runs at a fixed concurrency.

    .venv/bin/python docs/bench/profile_pages.py --model ocr --concurrency 4 --seconds 25 --out prof-out

Starts a server as ``aieng bench`` does (``bench.kit.start_server``), warms it, then records each of its
processes with ``py-spy record --idle -f raw`` (50 samples/s, every thread) while the same closed loop
as the bench (``bench_pages.closed``) sends ``1.2 x seconds`` pages, and prints for each process the
share of samples per leaf frame and per aieng frame on the stack.  ``--idle`` keeps waiting threads in
the samples, so a thread's share of the process's samples is its share of the wall time (each thread
is one row of the total: a process with 4 threads shows a thread busy all the time as 25%).  Needs
py-spy (the ``dev`` extra) and permission to ptrace the server (same user; no Yama restriction).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from aieng.config import load_config  # noqa: E402
from aieng.runtime import cpuacct  # noqa: E402
from aieng.tools.bench import pages as bench_pages  # noqa: E402
from aieng.tools.bench.kit import start_server, stop_server  # noqa: E402


def summarise(path: str, top: int = 8) -> list[str]:
    total, leaf, incl = 0, collections.Counter(), collections.Counter()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            stack, _, n = line.rstrip().rpartition(" ")
            if not n.isdigit():
                continue
            total += int(n)
            frames = stack.split(";")
            leaf[frames[-1]] += int(n)
            for f in set(frames):
                if "aieng" in f:
                    incl[f] += int(n)
    out = [f"  {total} samples"]
    out += [f"  leaf {v / total:6.1%} {k[:100]}" for k, v in leaf.most_common(top)]
    out += [f"  incl {v / total:6.1%} {k[:100]}" for k, v in incl.most_common(top)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ocr", choices=("ocr", "layout"))
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=25)
    ap.add_argument("--out", default="prof-out")
    args = ap.parse_args()
    if args.model == "ocr":
        from aieng.tools.bench.ocr import REPORT, steps_of
        images = bench_pages.pages()
    else:
        from aieng.tools.bench.layout import REPORT, steps_of
        images = bench_pages.pages(figure=True)
    os.makedirs(args.out, exist_ok=True)
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    proc, addr, _ = start_server(REPORT.serve, load_config().model_repository)
    try:
        c = args.concurrency
        asyncio.run(bench_pages.closed(addr, args.model, images, c, 2 * c, steps_of))  # warm
        names = {pid: name for pid, (name, _) in cpuacct.snapshot(proc.pid).items()}
        spies = {pid: subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(args.seconds), "-r", "50",
                                        "--idle", "--nonblocking", "-f", "raw",
                                        "-o", os.path.join(args.out, f"{name}-{pid}.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for pid, name in names.items()}
        before = cpuacct.snapshot(proc.pid)
        r = asyncio.run(bench_pages.closed(addr, args.model, images, c, int(args.seconds * 1.2), steps_of))
        used = cpuacct.delta(before, cpuacct.snapshot(proc.pid))
        for s in spies.values():
            s.wait(120)
    finally:
        stop_server(proc)
    print(f"c={c}: {r['rate']:.2f} pages/s, p50 {r['p50']:.2f} s, steps "
          + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r["steps"].items()) + f", batch {r['batch']}")
    print("CPU s while loaded: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(used.items())))
    for pid, name in names.items():
        path = os.path.join(args.out, f"{name}-{pid}.txt")
        if os.path.exists(path):
            print(f"{name} (pid {pid}):")
            print("\n".join(summarise(path)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
