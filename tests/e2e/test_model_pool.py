"""Model pool, first step against the real server: a run-time load reports each worker's measured
footprint (its RSS growth across the build, ``VersionLoaded.footprint_bytes``), which ``models`` shows.

The pool's budget and eviction rules themselves are pure (aieng/frontend/pool.py, tests/unit/test_pool.py);
lazy loading and eviction are not wired into the server yet (docs/rollout.md, "Model pool").
"""
from __future__ import annotations

import os

import pytest

from tests.e2e.test_hotswap import base_repo, copy_version, models
from tests.e2e.test_rollout import cli, start

pytestmark = pytest.mark.e2e


def test_run_time_load_reports_the_executor_footprint(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo, with_minilm=True)
    srv = start(make_server, tmp_path, repo)
    vdir = copy_version(repo, "minilm", "2", src_version="1")  # same weights: its golden set passes
    weights = os.path.getsize(os.path.join(vdir, "model.onnx"))
    code, out, err = cli(srv, "models", "load", "minilm", "2")
    assert code == 0, err + out
    load = models(srv)["minilm"]["versions"]["2"]["load"]
    assert load["state"] == "ready"
    executor = [n for n in load["footprint_bytes"] if "executor" in n]
    assert len(executor) == 1, load["footprint_bytes"]
    footprint = load["footprint_bytes"][executor[0]]
    print(f"minilm session footprint: executor RSS +{footprint / 2**20:.1f} MiB for a "
          f"{weights / 2**20:.1f} MiB model file; every worker: {load['footprint_bytes']}")
    # ONNX Runtime holds the weights in memory: the session costs at least half the file's size
    assert footprint > weights // 2
