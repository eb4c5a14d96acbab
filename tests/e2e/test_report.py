"""The pipeline-stage timing report against a live server."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aieng.report import fetch
from aieng.frontend.stats import STAGES
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


def test_report_covers_every_stage_and_adds_up(server, tmp_path):
    fetch(server.addr, reset=True)
    with server.client() as c:
        timings = [c.infer("minilm", {"text": f"report me {i} " * (1 + i)})["timing_us"] for i in range(20)]
    for t in timings:  # per-request timing in the response uses the same stage names
        assert set(t) >= set(STAGES) - {"frontend_out"} | {"total"}
        assert sum(t[s] for s in STAGES if s != "frontend_out") <= t["total"] + 50
    stats = fetch(server.addr)
    m = stats["models"]["minilm"]
    assert m["requests"] == 20
    assert sum(m["batch_sizes"].values()) == 20
    assert 0.0 <= m["padding_waste"] < 1.0
    assert m["stages_us"]["inference"]["p50"] > 0
    shares = sum(m["stages_us"][s]["share"] for s in STAGES)
    assert abs(shares - 1.0) < 1e-6

    png = tmp_path / "report.png"
    r = subprocess.run([sys.executable, "-m", "aieng.cli", "report", "--addr", server.addr, "--since", "600",
                        "--reset", "--png", str(png)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for stage in STAGES:
        assert f"| {stage} |" in r.stdout
    assert "padding waste" in r.stdout
    assert png.stat().st_size > 1000
    assert fetch(server.addr)["models"] == {}  # --reset started a new window
