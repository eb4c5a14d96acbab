"""The pipeline-stage timing report against a live server."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from aieng.frontend.observe.stats import STAGES
from aieng.tools.report import fetch
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


# The stages of one request are differences of the frontend's own monotonic stamps (receipt,
# each hand-off, the answer) split by the workers' self-reported compute times, so they add up
# to ``total`` exactly but for integer truncation (under 1 us per stage) and the clipping of a
# queue time at 0: 50 us covers that with room to spare, and anything lost or counted twice
# (a missing stage, a stage stamped from the wrong hand-off) is far above it.
PER_REQUEST_SLACK_US = 50


def stage_sum_tolerance_us(total_mean_us: float) -> float:
    """For means over the window: 10% of the total or 1 ms, whichever is larger.  The report's
    table and bar chart are read at millisecond resolution; an error below this is invisible
    in them, one above it would mislead a reader about where the time goes."""
    return max(1000.0, 0.1 * total_mean_us)


def test_report_covers_every_stage_and_adds_up(server, tmp_path):
    fetch(server.addr, reset=True, admin_addr=server.admin_addr)
    timings, walls = [], []
    with server.client() as c:
        for i in range(20):
            t0 = time.monotonic()
            timings.append(c.infer("minilm", {"text": f"report me {i} " * (1 + i)})["timing_us"])
            walls.append((time.monotonic() - t0) * 1e6)
    for t, wall in zip(timings, walls):  # per-request timing in the response uses the same stage names
        assert set(t) >= set(STAGES) - {"frontend_out"} | {"total"}
        staged = sum(t[s] for s in STAGES if s != "frontend_out")
        assert staged <= t["total"] + PER_REQUEST_SLACK_US, t
        assert staged >= t["total"] - PER_REQUEST_SLACK_US, t  # no part of the total left unattributed
        assert t["total"] <= wall, (t, wall)  # the server's total lies inside the client's round trip
    stats = fetch(server.addr)
    m = stats["models"]["minilm"]
    assert m["requests"] == 20
    means = {s: m["stages_us"][s]["mean"] for s in STAGES}
    total_mean = m["stages_us"]["total"]["mean"]
    tol = stage_sum_tolerance_us(total_mean)
    assert abs(sum(means.values()) - total_mean) <= tol, (means, total_mean)
    # the same window from the other side: the totals the clients were sent (which end before
    # frontend_out, the time spent sending them) against the stage means the report shows
    sent_mean = sum(t["total"] for t in timings) / len(timings)
    assert abs(sum(means.values()) - means["frontend_out"] - sent_mean) <= tol, (means, sent_mean)
    assert sum(m["batch_sizes"].values()) == 20
    assert 0.0 <= m["padding_waste"] < 1.0
    assert m["stages_us"]["inference"]["p50"] > 0
    shares = sum(m["stages_us"][s]["share"] for s in STAGES)
    assert abs(shares - 1.0) < 1e-6

    png = tmp_path / "report.png"
    r = subprocess.run([sys.executable, "-m", "aieng.cli", "report", "--addr", server.addr, "--since", "600",
                        "--reset", "--admin-addr", server.admin_addr, "--png", str(png)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for stage in STAGES:
        assert f"| {stage} |" in r.stdout
    assert "padding waste" in r.stdout
    assert png.stat().st_size > 1000
    assert fetch(server.addr)["models"] == {}  # --reset started a new window
