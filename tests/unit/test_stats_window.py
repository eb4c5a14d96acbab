"""The frontend's per-model stage windows (``frontend/observe/stats``) grow as rows arrive: a model that
answers a few requests holds a few KiB, not a full 2 MB window (a repository of a hundred small models),
and a full window still keeps the newest ``window`` rows."""
from __future__ import annotations

import numpy as np

from aieng.frontend.observe import stats
from aieng.frontend.observe.stats import StageStats


def test_a_model_with_one_answer_holds_a_small_window():
    s = StageStats()
    s.add("m", {"inference": 5}, 1, 1, 0)
    s.add_steps("m", [["tensor", 3, "ok"]])
    ring, step = s.rings["m"], s.steps["m"]["tensor"]
    held = ring.t.nbytes + ring.stages.nbytes + ring.meta.nbytes + step.t.nbytes + step.row.nbytes
    assert held <= 64 * 1024, held
    assert s.summary()["models"]["m"]["requests"] == 1


def test_the_window_grows_to_its_size_then_keeps_the_newest_rows():
    window = 3 * stats.FIRST_ROWS + 5  # not a power of two times the first size
    s = StageStats(window=window)
    total = 2 * window + 7
    for k in range(total):
        s.add("m", {"inference": k}, 1, 1, 0)
    ring = s.rings["m"]
    assert len(ring.t) == window
    _, mat, _ = ring.rows(0.0)
    kept = sorted(mat[:, stats.STAGES.index("inference")].tolist())
    assert kept == list(range(total - window, total))


def test_rows_before_the_first_wrap_are_all_kept_in_order():
    s = StageStats(window=1000)
    for k in range(stats.FIRST_ROWS * 2 + 3):
        s.add("m", {"inference": k}, 2, 3, 0)
    ts, mat, meta = s.rings["m"].rows(0.0)
    assert mat[:, stats.STAGES.index("inference")].tolist() == list(range(stats.FIRST_ROWS * 2 + 3))
    assert np.all(np.diff(ts) >= 0) and meta[:, 0].tolist() == [2] * len(ts)


def test_step_windows_grow_and_wrap_too():
    s = StageStats()
    for k in range(stats.STEP_WINDOW + 10):
        s.add_steps("m", [["tensor", k, "ok"]])
    ring = s.steps["m"]["tensor"]
    assert len(ring.t) == stats.STEP_WINDOW
    assert sorted(ring.row[:, 0].tolist()) == list(range(10, stats.STEP_WINDOW + 10))
