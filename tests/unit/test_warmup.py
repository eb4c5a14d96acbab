"""A session's start-up warm-up (``ModelSession.warmup``) and its row cap (``AIENG_WARMUP_MAX_ROWS``).

A real demo model (tabular: fixed shapes, max_batch_size 64) in a real one-thread ONNX Runtime session.
"""
from __future__ import annotations

import pytest

from aieng.config import load_config
from aieng.gpu_executor.sessions import ModelSession
from tests.unit.demo import needs_demo_models, spec

pytestmark = needs_demo_models


def rows_run(max_rows: int) -> list[int]:
    sess = ModelSession(spec("tabular"), "cpu", 1, False)
    sess.warmup(max_rows=max_rows)
    return sorted({rows for rows, _length, _s in sess.warm_costs})


def test_the_warm_up_runs_up_to_the_models_max_batch_without_a_cap():
    assert rows_run(0) == [1, 2, 4, 8, 16, 32, 64]


def test_a_row_cap_stops_the_warm_up_there():
    assert rows_run(8) == [1, 2, 4, 8]


def test_the_cap_is_a_setting_that_refuses_a_negative_count():
    assert load_config(environ={"AIENG_WARMUP_MAX_ROWS": "8"}).warmup_max_rows == 8
    with pytest.raises(ValueError, match="warmup_max_rows must be >= 0"):
        load_config(environ={"AIENG_WARMUP_MAX_ROWS": "-1"}).validate()
