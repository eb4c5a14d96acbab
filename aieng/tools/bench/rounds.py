"""Closed-loop levels over several servers (or front doors) in interleaved rounds, for ``aieng bench``.

``closed_rounds(sides, ...)``: at each level every side is warmed, then the level's requests go in
``rounds`` rounds of the same inputs, the sides taking turns within each, so a shared machine's drift
falls on all alike; per side one row per level (``loadgen.merge_levels``) with the CPU the side's process
tree used during its own turns (``runtime.cpuacct``), the server's stage report for a ``report`` side,
and, given a ``probe`` (the in-process limit), the mean of its readings taken after each round.  The bench
(servers side by side) and ``--transport`` (one server's doors) both measure this way.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from aieng.runtime import cpuacct
from aieng.tools.bench.kit import answered
from aieng.tools.loadgen import Progress, merge_levels, run_level

ROUNDS = 3  # closed-loop rounds per level, the sides taking turns: a shared machine's drift hits all alike


@dataclass(frozen=True)
class Side:
    """One thing measured: the address to load, the process tree whose CPU is its cost, whether to read
    the aieng server's own report, the transport the load speaks (over TLS trusting ``tls_ca``), and the
    model it asks for when not the run's (``--against``: another model answering the same inputs)."""
    addr: str
    pid: int
    report: bool = False
    transport: str = "zmq"
    tls_ca: str | None = None
    model: str = ""


def closed_rounds(sides: dict[str, Side], model: str, inputs: list[dict], levels: list[int], n: int,
                  rounds: int, probe: Callable[[], float] | None = None) -> dict[str, list[dict]]:
    """Every side at each level, ``rounds`` rounds of ``n / rounds`` requests (the module's doc); per
    label one row per level, with ``cpu``, ``rounds``, ``round_limit`` (the probe's mean, or None) and,
    for a ``report`` side, ``report``."""
    from aieng.tools.report import fetch

    out: dict[str, list[dict]] = {label: [] for label in sides}
    per = max(1, n // rounds)
    for c in levels:
        for s in sides.values():
            asyncio.run(run_level(s.addr, s.model or model, inputs[:min(len(inputs), 4 * c)], c, 60,
                                  s.transport, tls_ca=s.tls_ca))
            if s.report:
                fetch(s.addr, reset=True)
        parts: dict[str, list[dict]] = {label: [] for label in sides}
        used: dict[str, dict[str, float]] = {label: {} for label in sides}
        limits = []
        for k in range(rounds):
            chunk = [inputs[(k * per + i) % len(inputs)] for i in range(per)]
            for label, s in sides.items():
                before = cpuacct.snapshot(s.pid)
                progress = Progress(f"{label} c={c} round {k + 1}/{rounds}", per)
                r = asyncio.run(run_level(s.addr, s.model or model, chunk, c, 60, s.transport, progress,
                                          tls_ca=s.tls_ca))
                parts[label].append(r)
                progress.close()
                for name, secs in cpuacct.delta(before, cpuacct.snapshot(s.pid)).items():
                    used[label][name] = used[label].get(name, 0.0) + secs
            if probe is not None:
                limits.append(probe())
        for label, s in sides.items():
            r = merge_levels(parts[label])
            r["cpu"], r["rounds"] = cpuacct.per_request_ms(used[label], answered(r)), rounds
            r["round_limit"] = sum(limits) / len(limits) if limits else None
            if s.report:
                r["report"] = fetch(s.addr)["models"].get(s.model or model, {})
            out[label].append(r)
    return out
