#!/usr/bin/env python3
"""What a hundred small ONNX files cost the server (issue 35, "Numbers to show: many models").

Builds ``N`` distinct small graphs with ``onnx.helper`` in a temporary repository, bare ``model.onnx`` files
(zero-config): ``y = x @ W + b`` with a few KB to ~100 KB of weights each, most with a symbolic batch
axis (batched: the scan measures their cap), every fourth with a fixed first axis (unbatched). It then

- starts the real server on one of them and on all ``N`` (``tests.conftest.ServerProcess``: loopback,
  1 preprocess and 1 postprocess worker unless ``--pre``/``--post``), timing each start until ready
  (warm-up included);
- reads PSS and RSS of every server process (supervisor, frontend, pools, executor, gateway) per role,
  and their growth from 1 to ``N`` models, per added model;
- answers one request per model over the native client and checks each answer against numpy;
- loads the same ``N`` files as ``N`` ONNX Runtime sessions in one plain child process (1 intra-op
  thread, as an executor lane) and reports its RSS growth per session: the goal is the server's growth
  per model within 1.5x of it.

    PYTHONPATH=$PWD .venv/bin/python docs/bench/many_models.py [--n 100]

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


def role(p: psutil.Process) -> str:
    try:
        title = " ".join(p.cmdline())
    except psutil.Error:
        return "?"
    for r in ("preprocess", "postprocess", "executor", "gateway", "frontend", "supervisor"):
        if r in title:
            return r
    return "mp-helper" if "multiprocessing" in title or "-c from" in title else title[:40]


def memory(pid: int) -> dict[str, list[int]]:
    """Per role: [processes, PSS bytes, RSS bytes] over the supervisor's tree."""
    sup = psutil.Process(pid)
    out: dict[str, list[int]] = {}
    for p in [sup] + sup.children(recursive=True):
        try:
            full = p.memory_full_info()
        except psutil.Error:
            continue
        r = "supervisor" if p.pid == pid else role(p)
        acc = out.setdefault(r, [0, 0, 0])
        acc[0] += 1
        acc[1] += full.pss
        acc[2] += full.rss
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
        mem_after = memory(srv.pid)  # after each model's first request (lazy allocations counted)
    finally:
        srv.stop()
    return {"start_s": start_s, "mem": mem, "mem_after": mem_after, "wrong": wrong, "answer_s": answer_s}


ORT_CHILD = r"""
import json, sys, psutil, onnxruntime as ort, numpy as np
paths = sys.argv[1:]
def rss(): return psutil.Process().memory_full_info()
opts = ort.SessionOptions(); opts.intra_op_num_threads = 1; opts.inter_op_num_threads = 1
s = ort.InferenceSession(paths[0], sess_options=opts, providers=["CPUExecutionProvider"])  # the library
base = rss(); sessions = []
for p in paths:
    s = ort.InferenceSession(p, sess_options=opts, providers=["CPUExecutionProvider"])
    i = s.get_inputs()[0]; shape = [1 if not isinstance(d, int) else d for d in i.shape]
    s.run(None, {i.name: np.zeros(shape, np.float32)}); sessions.append(s)
end = rss()
print(json.dumps({"rss": end.rss - base.rss, "pss": end.pss - base.pss}))
"""


def ort_growth(tmp: pathlib.Path, names: list[str]) -> dict:
    paths = [str(tmp / "all" / n / "1" / "model.onnx") for n in names]
    out = subprocess.run([sys.executable, "-c", ORT_CHILD, *paths], capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--pre", type=int, default=1)
    ap.add_argument("--post", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="many-"))
    names = build(tmp / "all", args.n)
    size = sum((tmp / "all" / n / "1" / "model.onnx").stat().st_size for n in names)
    one = serve(tmp, names, 1, args)
    many = serve(tmp, names, args.n, args)
    ort = ort_growth(tmp, names)
    per = args.n - 1
    mib = 1 / 2**20
    print(f"{args.n} models, {size / 1024:.0f} KiB of ONNX files; load average {os.getloadavg()}; "
          f"{os.cpu_count()} cores")
    print(f"start until ready (warm-up included): 1 model {one['start_s']:.1f} s, {args.n} models "
          f"{many['start_s']:.1f} s; one request per model: {many['answer_s']:.2f} s, wrong answers: "
          f"{many['wrong']}")
    print(f"{'role':<12} {'procs':>5} {'PSS 1 (MiB)':>12} {'PSS N':>8} {'KiB/model':>10} "
          f"{'RSS/model KiB':>14} {'after req KiB/model':>20}")
    tot = [0, 0, 0]
    for r in sorted(many["mem"]):
        a = one["mem"].get(r, [0, 0, 0])
        z = many["mem"][r]
        after = many["mem_after"].get(r, z)
        d_pss, d_rss, d_after = (z[1] - a[1]) / per, (z[2] - a[2]) / per, (after[1] - a[1]) / per
        tot = [tot[0] + d_pss, tot[1] + d_rss, tot[2] + d_after]
        print(f"{r:<12} {z[0]:>5} {a[1] * mib:>12.1f} {z[1] * mib:>8.1f} {d_pss / 1024:>10.1f} "
              f"{d_rss / 1024:>14.1f} {d_after / 1024:>20.1f}")
    print(f"{'all':<12} {'':>5} {'':>12} {'':>8} {tot[0] / 1024:>10.1f} {tot[1] / 1024:>14.1f} "
          f"{tot[2] / 1024:>20.1f}")
    o = ort["pss"] / args.n / 1024
    print(f"ONNX Runtime alone, {args.n} sessions in one process (one run each): {o:.1f} KiB PSS per session "
          f"({ort['rss'] / args.n / 1024:.1f} KiB RSS); server/ORT, after requests: {tot[2] / 1024 / o:.2f}x")
    return 1 if many["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
