"""The OIP gateway's CPU per request, two or more code trees side by side (issue 35, "the OIP doors as fast
as the native one").

    N=500 ROUNDS=6 LEVELS=1,16 TRANSPORTS=http,grpc \
        .venv/bin/python docs/bench/gateway_cpu_ab.py before=/tmp/before now=.

Each ``label=tree`` is the root of a checkout (``git archive HEAD aieng | tar -x -C /tmp/before`` makes
one); each runs a real server serving minilm from this checkout's ``models`` with the OIP doors on, its
code from its own tree (``python -m`` puts the working directory first on ``sys.path``).  At each
concurrency and transport the same closed loop (``loadgen.run_level``) drives every server in ``ROUNDS``
interleaved rounds of ``N`` requests (the order flips each round), so a neighbour's load falls on each
alike; the figure is ``utime + stime`` of the ``aieng::gateway`` process from ``/proc`` over answered
requests, which moves far less with neighbours than req/s does (the total, then each label's per-round median
and range).  Two labels on the same tree show the noise.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from aieng.config import load_config  # noqa: E402
from aieng.runtime import cpuacct  # noqa: E402
from aieng.tools.bench.kit import free_port, start_server, stop_server  # noqa: E402
from aieng.tools.loadgen import run_level, sample_inputs  # noqa: E402


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        return cpuacct.parse_stat(f.read())[1] / cpuacct.CLK_TCK


def start(tree: str, repo: str) -> tuple:
    """A server running ``tree``'s code: (process, {transport: address}, gateway pid)."""
    ports = {"http": f"127.0.0.1:{free_port()}", "grpc": f"127.0.0.1:{free_port()}"}
    here = os.getcwd()
    os.chdir(tree)
    try:
        env = {"AIENG_OIP_HTTP_ADDR": ports["http"], "AIENG_OIP_GRPC_ADDR": ports["grpc"], "PYTHONPATH": tree}
        proc, addr, _ = start_server("minilm", repo, env)
    finally:
        os.chdir(here)
    gateway = [pid for pid, (name, _) in cpuacct.snapshot(proc.pid).items() if name.startswith("gateway")][0]
    return proc, {"zmq": addr, **ports}, gateway


def main(argv: list[str]) -> int:
    trees = dict(a.split("=", 1) for a in argv) if argv else {"now": "."}
    n, rounds = int(os.environ.get("N", "500")), int(os.environ.get("ROUNDS", "6"))
    levels = [int(x) for x in os.environ.get("LEVELS", "1,16").split(",")]
    transports = os.environ.get("TRANSPORTS", "http,grpc").split(",")
    repo = os.path.abspath(load_config().model_repository)
    servers: dict[str, tuple] = {}
    try:
        for label, tree in trees.items():
            servers[label] = start(os.path.abspath(tree), repo)
        inputs = sample_inputs("minilm", 200)
        for c in levels:
            for t in transports:
                used = {label: [0.0, 0] for label in servers}
                per_round: dict[str, list[float]] = {label: [] for label in servers}
                for _, door, _ in servers.values():  # warm
                    asyncio.run(run_level(door[t], "minilm", inputs[:4 * c], c, 60, t))
                for r in range(rounds):
                    order = list(servers.items())
                    for label, (_, door, gw) in order if r % 2 == 0 else order[::-1]:
                        before = cpu_s(gw)
                        res = asyncio.run(run_level(door[t], "minilm", [inputs[(r * n + i) % len(inputs)]
                                                                         for i in range(n)], c, 60, t))
                        spent, answered = cpu_s(gw) - before, res["requests"] - sum(res["errors"].values())
                        used[label][0] += spent
                        used[label][1] += answered
                        per_round[label].append(1000 * spent / max(1, answered))
                ms = {label: 1000 * s / max(1, k) for label, (s, k) in used.items()}
                first = next(iter(ms.values()))
                print(f"{t} c={c}: " + "  ".join(f"{k} {v:.3f} ({v / first:.2f})" for k, v in ms.items())
                      + f" gateway ms/request, {n * rounds} requests each, load {os.getloadavg()[0]:.1f}",
                      flush=True)
                for label, xs in per_round.items():
                    print(f"  {label}: rounds median {statistics.median(xs):.3f}, min {min(xs):.3f}, "
                          f"max {max(xs):.3f} ms/request", flush=True)
    finally:
        for proc, _, _ in servers.values():
            stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
