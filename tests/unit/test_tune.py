"""``aieng tune``'s search, rows and config file (``aieng/tools/tune.py``), with the measuring faked."""
from __future__ import annotations

import yaml

from aieng.config import load_config
from aieng.tools import tune


def fake_measure(scores: dict):
    """A ``measure`` whose throughput is looked up per (lanes, intra, spinning, workers, batch)."""
    seen = []

    def measure(model, repo, settings, inputs, n, concurrency, label):
        seen.append(dict(settings))
        key = tuple(settings[k] for k in ("executor_lanes", "intra_op_threads", "idle_wide_spinning",
                                          "preprocess_workers", "max_batch_size"))
        return tune.Row(dict(settings), c1_p50_ms=5.0, c1_rps=100.0, rps=scores.get(key, 100.0), p99_ms=9.0)

    return measure, seen


def test_axes_and_defaults_follow_the_machine():
    assert dict(tune.axes(2, 32))[("executor_lanes", "intra_op_threads")] == [(1, 2), (2, 1)]
    assert dict(tune.axes(16, 32))[("preprocess_workers",)] == [(1,), (2,), (4,), (8,), (16,)]
    assert dict(tune.axes(2, 6))[("max_batch_size",)] == [(6,)]
    assert tune.defaults(16, 32) == {"executor_lanes": 4, "intra_op_threads": 4, "idle_wide_spinning": True,
                                     "worker_sched_batch": True, "preprocess_workers": 4,
                                     "max_batch_size": 32}


def test_oversubscribed_rows_are_never_measured(monkeypatch):
    measure, seen = fake_measure({})
    monkeypatch.setattr(tune, "measure", measure)
    tune.search("m", "repo", 2, 32, [], 10, 8, budget=50)
    assert seen[0] == tune.defaults(2, 32)
    assert all(s["executor_lanes"] * s["intra_op_threads"] <= 2 for s in seen)
    assert len({tuple(sorted(s.items())) for s in seen}) == len(seen)  # no row twice


def test_a_change_is_kept_only_when_it_pays_and_the_budget_holds(monkeypatch):
    # one lane of two threads beats the defaults (2 lanes x 1); then one preprocess worker beats that
    measure, seen = fake_measure({(1, 2, True, 2, 32): 120.0, (1, 2, True, 1, 32): 130.0,
                                  (2, 1, False, 2, 32): 500.0})  # never reached: lanes moved first
    monkeypatch.setattr(tune, "measure", measure)
    rows, best = tune.search("m", "repo", 2, 32, [], 10, 8, budget=50)
    assert best.settings == {"executor_lanes": 1, "intra_op_threads": 2, "idle_wide_spinning": True,
                             "worker_sched_batch": True, "preprocess_workers": 1, "max_batch_size": 32}
    assert best.rps == 130.0
    rows, _ = tune.search("m", "repo", 2, 32, [], 10, 8, budget=3)
    assert len(rows) == 3


def test_a_row_with_errors_never_wins(monkeypatch):
    measure, _ = fake_measure({(1, 2, True, 2, 32): 999.0})

    def with_errors(*a, **kw):
        row = measure(*a, **kw)
        if row.rps == 999.0:
            row.errors = {"TIMEOUT": 3}
        return row

    monkeypatch.setattr(tune, "measure", with_errors)
    _, best = tune.search("m", "repo", 2, 32, [], 10, 8, budget=50)
    assert best.rps == 100.0


def test_the_written_file_is_a_config_serve_takes(tmp_path):
    best = tune.Row({"executor_lanes": 1, "intra_op_threads": 2, "idle_wide_spinning": False,
                     "preprocess_workers": 1, "max_batch_size": 8}, 4.0, 200.0, 150.0, 20.0)
    again = tune.Row(dict(best.settings), 4.1, 195.0, 147.0, 21.0)
    path = str(tmp_path / "tuned.yaml")
    tune.write_config(path, "minilm", best, tune.table([best], best, 32), again)
    text = open(path, encoding="utf-8").read()
    assert "# these settings measured again: 147.0 req/s (0.98 of the best row's 150.0)" in text
    assert yaml.safe_load(text) == best.settings
    cfg = load_config(path, environ={})
    assert (cfg.executor_lanes, cfg.intra_op_threads, cfg.idle_wide_spinning) == (1, 2, False)
    assert cfg.sources["executor_lanes"] == f"file:{path}"
    assert cfg.sources["max_inflight"] == "default"


def test_env_of_a_row_names_the_registry_variables():
    assert tune.as_env({"executor_lanes": 2, "idle_wide_spinning": False}) == {
        "AIENG_EXECUTOR_LANES": "2", "AIENG_IDLE_WIDE_SPINNING": "false"}
