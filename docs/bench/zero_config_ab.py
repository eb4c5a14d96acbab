#!/usr/bin/env python3
"""A model served zero-config against the same graph with a hand-written model.yaml, and at a fixed cap of 4
(issue 35: "A zero-config model batches as well as the same model with a hand-written model.yaml: >= 0.95x
its throughput at concurrency 32, side by side; and better than the same model at a fixed cap of 4").

    .venv/bin/python docs/bench/zero_config_ab.py [--onnx PATH] [--shape 32] [--levels 1,32]
        [--requests 600] [--rounds 3]

From ONE ONNX file (default: the ``model.onnx`` the minilm demo serves) it builds three repositories in a temp
directory, each serving the file as model ``--name``:

- ``bare``: the file alone: zero-config, its batch cap measured on the graph at load (models/measure.py);
- ``yaml``: the file with the model.yaml a user would write: each graph input and output as ``kind: tensor``
  with its dtype, ``preprocess``/``postprocess`` ``tensor``, and ``batching.max_batch_size`` as the demo's
  own model.yaml has it (minilm: 32; ``--cap`` for another file);
- ``cap4``: the same model.yaml at a fixed cap of 4 (Triton's guess for a config.pbtxt that names none).

Every side's ``max_wait_ms`` is the zero-config default (2 ms), so only the cap differs.  The three servers
(``bench/kit.start_server``) run at once; at each level the same closed loop with the same requests
(``tools/tensor_inputs``: every request of equal shape, ``--shape`` for the open axes, default 32 tokens)
drives them in ``--rounds`` interleaved rounds (``bench/rounds.closed_rounds``: the sides take turns, CPU per
side from /proc), so a neighbour's load falls on each alike.  Prints the load average at the start and per
level, each side's cap as served (the ``models`` op; the bare one's with its measure's why), and per level
req/s, p50, mean batch, CPU ms/request and the ratios bare/yaml and bare/cap4.  Bounded: ``--requests`` per
level and side, 60 s per request, 120 s per start.  A tiny check: ``--requests 40 --rounds 1 --levels 4``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from aieng.client import Client  # noqa: E402
from aieng.models.inferred import MAX_WAIT_MS  # noqa: E402
from aieng.models.onnx_infer import describe  # noqa: E402
from aieng.models.repo import latest, scan  # noqa: E402
from aieng.tools.bench.kit import fmt_num, ratio, start_server, stop_server  # noqa: E402
from aieng.tools.bench.rounds import Side, closed_rounds  # noqa: E402
from aieng.tools.loadgen import sample_inputs  # noqa: E402

SIDES = ("bare", "yaml", "cap4")


def demo_file(name: str) -> tuple[str, int | None]:
    """The ONNX file the demo model serves and the cap its own model.yaml gives."""
    versions = scan(os.path.join(ROOT, "models"), [name])[name]
    spec = versions[latest(versions)]
    return spec.onnx_path, int(spec.batching.max_batch_size)


def model_yaml(onnx: str, cap: int) -> str:
    """The tensor model.yaml a user would write for ``onnx``: names and dtypes from its graph."""
    info = describe(onnx)

    def decl(t) -> str:
        return f"  - {{name: {t.name}, kind: tensor, dtype: {t.np_dtype}}}"

    return "\n".join(["description: the same graph, described by hand", "inputs:",
                      *map(decl, info.inputs), "outputs:", *map(decl, info.outputs),
                      "preprocess: {type: tensor}", "postprocess: {type: tensor}",
                      f"batching: {{max_batch_size: {cap}, max_wait_ms: {MAX_WAIT_MS}}}"]) + "\n"


def build(root: str, name: str, onnx: str, cap: int) -> dict[str, str]:
    """The three repositories (module doc) under ``root``: side -> repository."""
    repos = {}
    for side in SIDES:
        vdir = os.path.join(root, side, name, "1")
        os.makedirs(vdir)
        shutil.copyfile(onnx, os.path.join(vdir, "model.onnx"))
        if side != "bare":
            with open(os.path.join(vdir, "model.yaml"), "w", encoding="utf-8") as fh:
                fh.write(model_yaml(onnx, cap if side == "yaml" else 4))
        repos[side] = os.path.join(root, side)
    return repos


def served_cap(addr: str, name: str) -> str:
    """What the server says it batches at: the cap, and for a zero-config model why."""
    with Client(addr) as c:
        pub = c.models()["models"][name]["versions"]["1"]
    inf = pub.get("inferred")
    return f"cap {pub['max_batch_size']}" + (f" ({inf['batching_why']}; {inf['cap_why']})" if inf else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", help="the ONNX file (default: the one the demo model --name serves)")
    ap.add_argument("--name", default="minilm", help="the model's name (and the demo whose file is default)")
    ap.add_argument("--cap", type=int, help="the hand-written cap (default: the demo model.yaml's, else 32)")
    ap.add_argument("--shape", action="append", help="request shapes (aieng bench --shape); default 32")
    ap.add_argument("--levels", default="1,32")
    ap.add_argument("--requests", type=int, default=600, help="requests per level and side, all rounds")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    onnx, cap = os.path.abspath(args.onnx) if args.onnx else None, args.cap
    if onnx is None:
        onnx, demo_cap = demo_file(args.name)
        cap = cap or demo_cap
    cap = cap or 32
    levels = [int(x) for x in args.levels.split(",") if x]
    print(f"load average at the start: {os.getloadavg()[0]:.2f}; {onnx}; hand-written cap {cap}; "
          f"max_wait_ms {MAX_WAIT_MS} on every side", flush=True)
    procs = []
    with tempfile.TemporaryDirectory(prefix="aieng-zero-ab-") as tmp:
        repos = build(tmp, args.name, onnx, cap)
        inputs = sample_inputs(args.name, max(args.requests, 64), seed=3, repo=repos["bare"],
                               shapes=args.shape or ["32"])
        shapes = ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in inputs[0].items())
        print(f"requests: {shapes}", flush=True)
        try:
            sides = {}
            for side in SIDES:
                proc, addr, _log = start_server(args.name, repos[side])
                procs.append(proc)
                sides[side] = Side(addr, proc.pid)
                print(f"{side}: {served_cap(addr, args.name)}", flush=True)
            out = closed_rounds(sides, args.name, inputs, levels, args.requests, args.rounds)
        finally:
            for proc in procs:
                stop_server(proc)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}\n")
    print("| concurrency | side | req/s | p50 ms | p99 ms | mean batch | CPU ms/req | errors |")
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    for i, c in enumerate(levels):
        for side in SIDES:
            r = out[side][i]
            print(f"| {c} | {side} | {r['rps']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                  f"{r['mean_batch']:.2f} | {r['cpu']['total']:.2f} | {r['errors'] or '-'} |")
    print()
    for i, c in enumerate(levels):
        rps = {side: out[side][i]["rps"] for side in SIDES}
        print(f"c={c}: bare/yaml {fmt_num(ratio(rps['bare'], rps['yaml']))} (issue: >= 0.95 at 32), "
              f"bare/cap4 {fmt_num(ratio(rps['bare'], rps['cap4']))} (issue: > 1 at 32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
