"""``aieng bench``'s closed loop over real servers side by side (``bench/rounds.closed_rounds``): the aieng
server and the one-process baseline both running, each level measured in rounds in which the servers take
turns on the same inputs, merged into one row per server and level with the CPU of that server's processes
alone; after each round a probe (the in-process limit; here a stand-in counting its calls) is read.
tabular, 600 requests per level: a run of the mechanism, not of speed (no figure here is compared to a bar).
"""
from __future__ import annotations

import pytest

from aieng.tools.bench.kit import start_server, stop_server
from aieng.tools.bench.rounds import Side, closed_rounds
from aieng.tools.bench.run import start_baseline
from aieng.tools.loadgen import sample_inputs
from tests.conftest import MODELS

pytestmark = pytest.mark.e2e
N = 600  # requests per level


def test_each_server_gets_every_round_of_every_level_and_only_its_own_cpu():
    inputs = sample_inputs("tabular", 40)
    procs = []
    try:
        proc, addr, _log = start_server("tabular", MODELS, {"AIENG_WARMUP_MAX_ROWS": "8"})
        procs.append(proc)
        bproc, baddr = start_baseline("tabular", MODELS, spinning=False)
        procs.append(bproc)
        sides = {"aieng": Side(addr, proc.pid, report=True), "baseline": Side(baddr, bproc.pid)}
        probes = []
        # enough requests that each server's CPU per level spans several clock ticks (``cpuacct`` reads
        # /proc in 10 ms ticks; on a fast machine 30 tabular requests of the baseline read as 0)
        out = closed_rounds(sides, "tabular", inputs, [1, 4], N, rounds=3,
                            probe=lambda: probes.append(len(probes) + 1) or 100.0 * len(probes))
    finally:
        for p in procs:
            stop_server(p)
    for label in ("aieng", "baseline"):
        rows = out[label]
        assert [(r["concurrency"], r["requests"], r["rounds"], r["errors"]) for r in rows] == [
            (1, N, 3, {}), (4, N, 3, {})]
        assert all(r["cpu"]["total"] > 0 for r in rows)
        assert [len(r["round_rps"]) for r in rows] == [3, 3]  # each round's own req/s, for its spread
        assert all(min(r["round_rps"]) > 0 for r in rows)
    aieng_roles = set(out["aieng"][0]["cpu"])
    assert {"frontend", "executor", "total"} <= aieng_roles  # the server's processes, by title
    assert set(out["baseline"][0]["cpu"]) == {"supervisor", "total"}  # one process, its tree's root
    assert out["aieng"][0]["report"]  # the server's own stage report over the level's rounds
    assert "report" not in out["baseline"][0]
    assert len([h for h in out["aieng"][0]["hops"] if "total" in h]) == N  # every native reply's timings
    # the limit is probed once after each round (3 rounds x 2 levels); each level's rows get their mean
    assert probes == [1, 2, 3, 4, 5, 6]
    assert [r["round_limit"] for r in out["aieng"]] == [200.0, 500.0]
    assert [r["round_limit"] for r in out["baseline"]] == [200.0, 500.0]
