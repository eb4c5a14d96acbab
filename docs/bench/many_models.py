#!/usr/bin/env python3
"""What a hundred small ONNX files cost the server (issue 35, "Numbers to show: many models").

Builds ``N`` distinct small graphs with ``onnx.helper`` in a temporary repository, bare ``model.onnx`` files
(zero-config): ``y = x @ W + b`` with a few KB to ~100 KB of weights each, most with a symbolic batch
axis (batched: the scan measures their cap), every fourth with a fixed first axis (unbatched). It then

- starts the real server on the first ``n`` of them for each ``n`` in ``--ns`` (default 1, 10 and 100;
  ``tests.conftest.ServerProcess``: loopback, 1 preprocess and 1 postprocess worker unless
  ``--pre``/``--post``), timing each start until ready (warm-up included);
- reads every server process's ``/proc/PID/smaps_rollup`` (supervisor, its multiprocessing helpers,
  frontend, each pool worker, executor, gateway), at rest and again after one request per model (answers
  checked against numpy), and fits a line through the points per process: the slope is what one model
  adds there, in PSS (shared pages split between their sharers) and USS (pages this process alone holds);
- loads the same files as ONNX Runtime sessions in one plain child process (1 intra-op thread, as an
  executor lane), one run each, and reports its growth per session: the goal is the server's growth
  per model within 1.5x of it.  Anonymous PSS is the sounder measure: a shared library's PSS moves with
  whatever else on the machine maps it, anonymous memory only with this server's own processes.

    PYTHONPATH=$PWD .venv/bin/python docs/bench/many_models.py [--ns 1,10,100]

Memory and start time do not depend much on other load; the load average is printed with the results.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.onnx_files import matmul_add, save_matmul_add  # noqa: E402  (the test suite's repository)


def build(repo: pathlib.Path, n: int) -> list[str]:
    names = [f"m{k:03d}" for k in range(n)]
    for k, name in enumerate(names):
        save_matmul_add(repo / name / "1", k)
    return names


def title(p: psutil.Process) -> str:
    """The process's name in the table: its ``aieng::`` title, or which multiprocessing helper it is."""
    try:
        line = " ".join(p.cmdline())
    except psutil.Error:
        return "?"
    if line.startswith("aieng::"):
        return line.split()[0][len("aieng::"):]
    for helper in ("forkserver", "resource_tracker"):
        if helper in line:
            return helper
    return line[:40]


def rollup(pid: int) -> dict[str, int]:
    """``smaps_rollup``'s fields in bytes, with ``uss`` = private clean + private dirty."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    out["uss"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def memory(pid: int) -> dict[str, dict[str, int]]:
    """Per process of the supervisor's tree (named by title): PSS, USS, RSS, anonymous PSS, in bytes."""
    sup = psutil.Process(pid)
    out: dict[str, dict[str, int]] = {}
    for p in [sup] + sup.children(recursive=True):
        try:
            r = rollup(p.pid)
        except OSError:
            continue
        out[title(p)] = {"pss": r["Pss"], "uss": r["uss"], "rss": r["Rss"], "anon": r.get("Pss_Anon", 0)}
    return out


def serve(tmp: pathlib.Path, names: list[str], n: int, args) -> dict:
    from tests.conftest import ServerProcess

    repo = tmp / f"repo{n}"
    repo.mkdir()
    for name in names[:n]:
        os.symlink(tmp / "all" / name, repo / name)
    t0 = time.perf_counter()
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS=str(args.pre),
                        AIENG_POSTPROCESS_WORKERS=str(args.post)).start(timeout=args.timeout)
    try:
        start_s = time.perf_counter() - t0
        time.sleep(args.settle)  # a start's last allocations (threads parking, caches) before reading
        mem = memory(srv.pid)
        wrong = 0
        t1 = time.perf_counter()
        with srv.client() as c:
            for k, name in enumerate(names[:n]):
                w, b, batched = matmul_add(k)
                x = np.random.default_rng(1000 + k).standard_normal((1, w.shape[0])).astype(np.float32)
                out = c.infer(name, {"x": x[0] if batched else x})["outputs"]["y"]
                want = (x @ w + b)[0] if batched else x @ w + b
                wrong += not np.allclose(out, want, rtol=1e-4, atol=1e-4)
        answer_s = time.perf_counter() - t1
        time.sleep(args.settle)
        mem_after = memory(srv.pid)  # after each model's first request (lazy allocations counted)
    finally:
        srv.stop()
    return {"start_s": start_s, "mem": mem, "mem_after": mem_after, "wrong": wrong, "answer_s": answer_s}


ORT_CHILD = r"""
import json, re, sys, onnxruntime as ort, numpy as np
paths = sys.argv[1:]
class Mem:
    def __init__(self):
        text = open("/proc/self/smaps_rollup").read()
        kb = lambda k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) * 1024
        self.rss, self.pss, self.anon = kb("Rss"), kb("Pss"), kb("Pss_Anon")
        self.uss = kb("Private_Clean") + kb("Private_Dirty")
def mem(): return Mem()
opts = ort.SessionOptions(); opts.intra_op_num_threads = 1; opts.inter_op_num_threads = 1
s = ort.InferenceSession(paths[0], sess_options=opts, providers=["CPUExecutionProvider"])  # the library
base = mem(); sessions = []
for p in paths:
    s = ort.InferenceSession(p, sess_options=opts, providers=["CPUExecutionProvider"])
    i = s.get_inputs()[0]; shape = [1 if not isinstance(d, int) else d for d in i.shape]
    s.run(None, {i.name: np.zeros(shape, np.float32)}); sessions.append(s)
end = mem()
print(json.dumps({k: getattr(end, k) - getattr(base, k) for k in ("rss", "pss", "uss", "anon")}))
"""


def ort_growth(tmp: pathlib.Path, names: list[str]) -> dict:
    paths = [str(tmp / "all" / n / "1" / "model.onnx") for n in names]
    out = subprocess.run([sys.executable, "-c", ORT_CHILD, *paths], capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def slope(ns: list[int], ys: list[float]) -> float:
    """Least-squares bytes per model through the points (n, y)."""
    return float(np.polyfit(np.array(ns, float), np.array(ys, float), 1)[0]) if len(ns) > 1 else 0.0


def table(runs: dict[int, dict], key: str, ns: list[int]) -> dict[str, dict[str, float]]:
    """Per process: KiB per model for each measure, and its MiB at the smallest n."""
    procs = sorted({p for n in ns for p in runs[n][key]})
    out = {}
    for p in procs:
        row = {}
        for m in ("pss", "uss", "anon", "rss"):
            ys = [runs[n][key].get(p, {}).get(m, 0) for n in ns]
            row[m] = slope(ns, ys) / 1024
            row[m + "0"] = ys[0] / 2**20
        out[p] = row
    return out


def show(rows: dict[str, dict[str, float]], label: str) -> dict[str, float]:
    print(f"\n{label}: KiB each model adds (least squares over n), and the process's MiB at the smallest n")
    print(f"{'process':<18} {'PSS MiB':>8} {'PSS/model':>10} {'USS/model':>10} {'anon PSS/model':>15} "
          f"{'RSS/model':>10}")
    tot = dict.fromkeys(("pss", "uss", "anon", "rss"), 0.0)
    for p, r in rows.items():
        for m in tot:
            tot[m] += r[m]
        print(f"{p:<18} {r['pss0']:>8.1f} {r['pss']:>10.1f} {r['uss']:>10.1f} {r['anon']:>15.1f} "
              f"{r['rss']:>10.1f}")
    print(f"{'all':<18} {'':>8} {tot['pss']:>10.1f} {tot['uss']:>10.1f} {tot['anon']:>15.1f} "
          f"{tot['rss']:>10.1f}")
    return tot


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,10,100", help="repository sizes to start, comma-separated")
    ap.add_argument("--pre", type=int, default=1)
    ap.add_argument("--post", type=int, default=1)
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds between ready (or the answers) and reading")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json", help="write every reading here")
    args = ap.parse_args()
    ns = sorted({int(x) for x in args.ns.split(",")})
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="many-"))
    names = build(tmp / "all", ns[-1])
    size = sum((tmp / "all" / n / "1" / "model.onnx").stat().st_size for n in names)
    runs = {n: serve(tmp, names, n, args) for n in ns}
    ort = ort_growth(tmp, names)
    big = ns[-1]
    print(f"{big} models, {size / 1024:.0f} KiB of ONNX files; load average {os.getloadavg()}; "
          f"{os.cpu_count()} cores")
    print("start until ready (warm-up included): " + ", ".join(
        f"{n} model(s) {runs[n]['start_s']:.1f} s" for n in ns)
        + f"; one request per model at {big}: {runs[big]['answer_s']:.2f} s, wrong answers: "
          f"{runs[big]['wrong']}")
    show(table(runs, "mem", ns), "at rest after ready")
    after = show(table(runs, "mem_after", ns), "after one request per model")
    o, oa = ort["pss"] / big / 1024, ort["anon"] / big / 1024
    print(f"\nONNX Runtime alone, {big} sessions in one process (one run each): {o:.1f} KiB PSS per session "
          f"({oa:.1f} anonymous, {ort['uss'] / big / 1024:.1f} USS, {ort['rss'] / big / 1024:.1f} RSS); "
          f"server/ORT after requests: {after['pss'] / o:.2f}x PSS, {after['anon'] / oa:.2f}x anonymous PSS "
          f"(the sounder: file-backed PSS moves with whatever else on the machine maps the same libraries)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"ns": ns, "runs": runs, "ort": ort}, indent=1))
    return 1 if any(runs[n]["wrong"] for n in ns) else 0


if __name__ == "__main__":
    sys.exit(main())
