"""Unit tests for ``aieng bench``'s pure parts (CPU accounting from /proc readings, ratios,
table formatting) and one real run of the baseline server (``python -m aieng.tools.baseline``)
on the tabular model, compared with the same processors run in this process."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from aieng.client import Client
from aieng.runtime import cpuacct
from aieng.tools.bench.run import fmt_closed, fmt_cpu, fmt_hops, fmt_table, ratio
from tests.unit.demo import MODELS, ROOT, needs_demo_models, spec


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int) -> str:
    """A /proc/<pid>/stat line: fields 3..13 filler, then utime (14) and stime (15), then more."""
    middle = " ".join(["S", str(ppid)] + ["0"] * 9)
    return f"{pid} ({comm}) {middle} {utime} {stime} 0 0 20 0 4 0 123\n"


# ------------------------------------------------------------ /proc parsing and CPU deltas
def test_parse_stat_counts_fields_from_the_last_paren():
    assert cpuacct.parse_stat(stat_line(42, "we ird) name", 7, 150, 30)) == (7, 180)


def test_name_of_uses_the_process_title():
    assert cpuacct.name_of(b"aieng::preprocess[0]\0\0", False) == "preprocess[0]"
    assert cpuacct.name_of(b"aieng::executor\0", False) == "executor"
    assert cpuacct.name_of(b"/usr/bin/python\0-c\0from multiprocessing...\0", False) == "other"
    assert cpuacct.name_of(b"python\0-m\0aieng.cli\0serve\0", True) == "supervisor"


def test_descendants_walks_the_whole_tree_and_nothing_else():
    parents = {10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 21: 20}
    assert sorted(cpuacct.descendants(10, parents)) == [10, 11, 12, 13]


def test_delta_and_per_request_from_two_readings():
    before = {10: ("supervisor", 1.00), 11: ("frontend", 2.00), 12: ("executor", 5.00),
              13: ("postprocess[0]", 0.50), 14: ("preprocess[0]", 0.30)}
    # 13 died and came back as 15 (counted from zero); 14 exited (its last part is lost).
    after = {10: ("supervisor", 1.02), 11: ("frontend", 2.40), 12: ("executor", 9.00),
             15: ("postprocess[0]", 0.20)}
    used = cpuacct.delta(before, after)
    assert used == pytest.approx({"supervisor": 0.02, "frontend": 0.40, "executor": 4.00,
                                  "postprocess[0]": 0.20})
    per = cpuacct.per_request_ms(used, 400)
    assert per == pytest.approx({"supervisor": 0.05, "frontend": 1.0, "executor": 10.0,
                                 "postprocess[0]": 0.5, "total": 11.55})


def test_delta_counts_a_reused_pid_with_a_new_name_from_zero():
    used = cpuacct.delta({7: ("executor", 3.0)}, {7: ("preprocess[0]", 0.25)})
    assert used == pytest.approx({"preprocess[0]": 0.25})


def test_snapshot_of_this_process_sees_its_own_cpu_time():
    me = os.getpid()
    first = cpuacct.snapshot(me)
    start = time.process_time()
    x = 0
    while time.process_time() - start < 0.2:  # burn 0.2 s of CPU (not wall) time
        x += 1
    used = cpuacct.delta(first, cpuacct.snapshot(me))
    assert first[me][0] == "supervisor"
    assert used["supervisor"] >= 0.1


# ------------------------------------------------------------ ratios and tables
def test_ratio_handles_missing_and_zero():
    assert ratio(90.0, 100.0) == pytest.approx(0.9)
    assert ratio(None, 100.0) is None
    assert ratio(90.0, None) is None
    assert ratio(90.0, 0.0) is None


def level(c: int, rps: float, mean_batch: float, cpu: dict, **kw) -> dict:
    row = {"concurrency": c, "requests": 100, "rps": rps, "p50_ms": 10.0, "p95_ms": 20.0, "p99_ms": 30.0,
           "mean_batch": mean_batch, "errors": {}, "cpu": cpu}
    row.update(kw)
    return row


SRV = [level(1, 50.0, 1.0, {"frontend": 1.0, "executor": 9.0, "preprocess[0]": 0.5, "total": 10.5},
             inprocess_cpu_ms=9.25, report={"padding_waste": 0.05}),
       level(16, 90.0, 6.0, {"frontend": 0.8, "executor": 6.0, "preprocess[0]": 0.4, "total": 7.2},
             inprocess_cpu_ms=6.7)]
BASE = [level(1, 40.0, 1.0, {"total": 11.0}, p50_ms=7.5), level(16, 60.0, 1.0, {"total": 12.0})]
BASE_OFF = [level(1, 25.0, 1.0, {"total": 10.0}), level(16, 45.0, 1.0, {"total": 11.0})]
# one c=1 answer: the stages of its timing_us (us) and the client's own latency
HOP_ROW = {"frontend_in": 50, "preprocess_queue": 300, "preprocess": 250, "handoff": 310, "batch_wait": 90,
           "inference": 5000, "postprocess_queue": 700, "hop.to_postprocess": 400, "hop.to_frontend": 300,
           "postprocess": 150, "total": 6850, "client": 8000}
SRV[0]["hops"] = [HOP_ROW]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_closed_table_puts_aieng_and_baseline_side_by_side():
    lines = fmt_closed(SRV, BASE, limit=100.0)
    head = cells(lines[0])
    assert head[:5] == ["concurrency", "aieng req/s", "ratio to limit", "baseline req/s", "aieng/baseline"]
    row = dict(zip(head, cells(lines[3])))
    assert row["concurrency"] == "16"
    assert row["ratio to limit"] == "0.90"
    assert row["baseline req/s"] == "60.0"
    assert row["aieng/baseline"] == "1.50"
    assert row["mean batch"] == "6.00"
    assert row["CPU ms/req"] == "7.20"
    assert dict(zip(head, cells(lines[2])))["padding waste"] == "5.0%"


def test_closed_table_sets_the_spinning_off_baseline_beside_and_the_p50_gap():
    lines = fmt_closed(SRV, BASE, 100.0, BASE_OFF)
    row = dict(zip(cells(lines[0]), cells(lines[2])))
    assert row["baseline spinning off req/s"] == "25.0"
    assert row["aieng/spinning off"] == "2.00"
    assert row["baseline p50 ms"] == "7.50"
    assert row["p50 - baseline p50"] == "+2.50"


def test_hop_table_adds_up_to_the_client_latency():
    lines = fmt_hops(SRV[0])
    rows = {cells(x)[0]: cells(x) for x in lines if x.startswith("| ") and not x.startswith("| step")}
    edge = rows["client <-> frontend (both transfers, the answer's build, the client's own loop)"]
    assert edge[1:] == ["hand-off", "1150", "1150"]
    assert rows["executor -> postprocess (output write included)"][2] == "400"
    # hand-offs: the edge 1150 + 300 + 310 + 400 + 300
    assert rows["all hand-offs"][2] == "2460"
    assert rows["client latency"][2] == "8000"


def test_closed_table_without_baseline_shows_dashes():
    row = dict(zip(cells(fmt_closed(SRV, None, 100.0)[0]), cells(fmt_closed(SRV, None, 100.0)[2])))
    assert (row["baseline req/s"], row["aieng/baseline"]) == ("-", "-")


def test_cpu_table_difference_and_per_process_columns():
    lines = fmt_cpu(SRV, BASE)
    head = cells(lines[0])
    row = dict(zip(head, cells(lines[2])))
    assert row["aieng minus in-process (target <= 1 ms)"] == "+1.25"
    assert row["baseline CPU ms/req"] == "11.00"
    roles = lines.index("| concurrency | frontend | preprocess[0] | executor | total |")
    assert cells(lines[roles + 3]) == ["16", "0.80", "0.40", "6.00", "7.20"]


def test_full_table_has_every_section():
    before = {"best": 100.0, "batch1_p50_ms": 8.0, "one_thread_batch1": 40.0,
              "rows": [{"batch": 1, "spinning": s, "arrival": 70.0 + s, "sorted": None, "cpu_ms": 9.0}
                       for s in (False, True)]}
    after = {"best": 95.0, "by_spinning": {False: 95.0, True: 80.0}}
    srv = {"closed": SRV, "open": [{"rate": 50.0, "rps": 49.0, "p50_ms": 12.0, "p95_ms": 20.0,
                                    "p99_ms": 25.0, "errors": {}}]}
    text = fmt_table("minilm", before, after, srv, {"closed": BASE}, 100.0, {"closed": BASE_OFF})
    assert "**100.0 req/s**" in text
    assert "best with intra-op spinning off 70.0, on 71.0" in text
    assert "| 1 | 70.0 | - | 71.0 | - | 9.00 |" in text
    assert "Baseline (spinning on), closed loop:" in text
    assert "Baseline (spinning off), closed loop:" in text
    assert "| client latency | | 8000 | 8000 |" in text
    assert "| 50.0 | 49.0 | 0.49 | 12.00 | 20.00 | 25.00 | - |" in text
    assert "p50 at concurrency 1 minus in-process batch-1 p50: +2.00 ms" in text


# ------------------------------------------------------------ the baseline server, for real
def in_process_answer(inputs: dict) -> dict:
    from aieng.gpu_executor.sessions import ModelSession
    from aieng.processing.post.chain import Chain
    from aieng.processing.pre.processors import PROCESSORS

    s = spec("tabular")
    tensors, _, _ = PROCESSORS[s.preprocess.type](s).process(inputs)
    sess = ModelSession(s, "cpu", 1, False)
    feeds, sizes = sess.feeds_from([dict(tensors)])
    outs = sess.run(feeds)
    return Chain(s)(dict(sess.request_outputs(outs, 0, sizes[0])), {})


@needs_demo_models
def test_baseline_answers_like_the_in_process_pipeline(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        addr = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    log = open(tmp_path / "baseline.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "aieng.tools.baseline", "--model", "tabular",
                             "--repo", str(MODELS), "--addr", addr],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        with Client(addr, timeout_s=1.0, dealer=True) as c:
            deadline = time.monotonic() + 15
            health = None
            while health is None and time.monotonic() < deadline and proc.poll() is None:
                try:
                    health = c.health()
                except TimeoutError:
                    pass
            assert health is not None and health["ready"] is True
            penguin = {"bill_length_mm": 47.5, "bill_depth_mm": 15.0, "flipper_length_mm": 217.0,
                       "body_mass_g": 5200.0, "island": "Biscoe", "sex": "male"}
            reply = c.infer("tabular", penguin)
            missing = c.infer("nope", {}, raise_on_error=False)
        expected = in_process_answer(penguin)
        assert (reply["ok"], reply["model"], reply["version"]) == (True, "tabular", "1")
        assert reply["outputs"]["label"] == expected["label"]
        np.testing.assert_allclose(reply["outputs"]["probabilities"], expected["probabilities"], rtol=1e-5)
        assert missing["error"]["code"] == "MODEL_NOT_FOUND"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        log.close()
    assert code == 0


def test_inprocess_cpu_is_read_at_the_nearest_measured_batch():
    """The gap printed against the server's mean batch uses the batch sizes the limit measured
    (cheapest configuration there), not a fresh run in a worse configuration."""
    from aieng.tools.bench.limit import InProcess

    inproc = InProcess.__new__(InProcess)
    inproc.max_batch = 32
    cache = {1: 8.4, 4: 7.4, 8: 7.6}
    assert inproc.cpu_at(4.55, 64, cache) == 7.4
    assert inproc.cpu_at(6.5, 64, cache) == 7.6
    assert inproc.cpu_at(1.0, 64, cache) == 8.4


def test_a_rows_batches_keep_their_members_but_run_in_a_shuffled_fixed_order():
    from aieng.tools.bench.limit import batches_of

    by_len = list(range(100))  # stand-in for indices sorted by length
    chunks = batches_of(by_len, 8)
    assert sorted(tuple(c) for c in chunks) == [tuple(by_len[s:s + 8]) for s in range(0, 100, 8)]
    assert chunks != [by_len[s:s + 8] for s in range(0, 100, 8)]  # not shortest first
    assert chunks[:3] == batches_of(by_len, 8)[:3]  # the same order every run


def test_stopping_a_spawned_process_removes_its_log_only_when_nothing_was_written(tmp_path):
    import subprocess
    import sys

    from aieng.tools.bench.kit import stop_server

    kept = []
    for name, text in (("quiet.log", ""), ("noisy.log", "a warning\n")):
        path = tmp_path / name
        path.write_text(text)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        proc.log_path = str(path)
        stop_server(proc)
        assert proc.returncode is not None
        kept.append(path.exists())
    assert kept == [False, True]


def test_the_best_row_is_found_and_rerun_on_a_rounds_inputs():
    from aieng.tools.bench.limit import InProcess
    from aieng.tools.loadgen import sample_inputs
    from tests.conftest import MODELS

    inproc = InProcess("tabular", MODELS, sample_inputs("tabular", 12), threads=2, row_seconds=2.0)
    before = {"rows": [{"batch": 4, "spinning": False, "arrival": 10.0, "sorted": 20.0},
                       {"batch": 1, "spinning": False, "arrival": 30.0, "sorted": None, "lanes": 2},
                       {"batch": 8, "spinning": True, "arrival": 25.0, "sorted": 29.0}]}
    assert inproc.best_config(before) == (1, "arrival", True, False)
    before["rows"][2]["sorted"] = 31.0
    assert inproc.best_config(before) == (8, "sorted", False, True)
    assert inproc.rerun((4, "sorted", False, False), [5, 1, 7, 3]) > 0
    assert inproc.rerun((1, "arrival", True, False), [5, 1, 7, 3]) > 0


def test_against_table_sets_two_models_side_by_side_with_ratios_and_hop_differences():
    from aieng.tools.bench.against import fmt_against

    hook = [level(1, 50.0, 1.0, {"frontend": 0.4, "postprocess[0]": 0.2, "total": 1.0}, p50_ms=1.3,
                  hops=[dict(HOP_ROW, handoff=150)]),
            level(32, 80.0, 6.5, {"frontend": 0.2, "total": 0.5}, round_rps=[90.0, 70.0, 80.0])]
    built = [level(1, 60.0, 1.0, {"frontend": 0.5, "total": 0.9}, p50_ms=1.0,
                   hops=[dict(HOP_ROW, handoff=10)]),
             level(32, 100.0, 7.0, {"frontend": 0.2, "total": 0.4}, errors={"TIMEOUT": 2},
                   round_rps=[100.0, 100.0, 100.0])]
    text = fmt_against("penguins", "tabular", {"penguins": hook, "tabular": built}, 300, 3)
    lines = text.splitlines()
    head = cells(next(x for x in lines if x.startswith("| concurrency | penguins req/s")))
    rows = [dict(zip(head, cells(x))) for x in lines if x.startswith(("| 1 | 50.0", "| 32 | 80.0"))]
    assert [r["req/s ratio"] for r in rows] == ["0.83", "0.80"]
    assert [r["ratio by round"] for r in rows] == ["-", "0.90 0.70 0.80"]  # c=1 given no rounds' figures
    assert rows[0]["p50 difference ms"] == "+0.30"
    assert rows[1]["penguins mean batch"] == "6.50"
    assert (rows[0]["penguins CPU ms/req"], rows[0]["tabular CPU ms/req"]) == ("1.000", "0.900")
    assert [r["errors"] for r in rows] == ["-", "tabular: TIMEOUT 2"]
    assert "| 1 | penguins | frontend 0.400, postprocess[0] 0.200 |" in lines
    hop = next(cells(x) for x in lines if x.startswith("| preprocess worker -> executor"))
    assert hop[1:] == ["150", "10", "+140"]
