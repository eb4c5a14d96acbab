"""``aieng tune`` for real: a server per row's settings, a config file that ``aieng config`` reads back."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import MODELS, ROOT

pytestmark = pytest.mark.e2e


def aieng(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env["AIENG_MODEL_REPOSITORY"] = MODELS
    return subprocess.run([sys.executable, "-m", "aieng.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_tune_measures_rows_and_writes_a_config_that_serve_takes(tmp_path):
    out = str(tmp_path / "tuned.yaml")
    run = aieng("tune", "tabular", "--requests", "40", "--concurrency", "4", "--rows", "2", "--out", out)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "measured again:" in run.stdout
    settings = yaml.safe_load(open(out, encoding="utf-8"))
    assert set(settings) == {"executor_lanes", "intra_op_threads", "idle_wide_spinning", "worker_sched_batch",
                             "preprocess_workers", "max_batch_size"}
    rows = [line for line in open(out, encoding="utf-8") if line.startswith("# | ") and "req/s" not in line]
    assert len(rows) == 2  # the defaults and one more: --rows 2
    shown = aieng("config", "--config", out)
    assert shown.returncode == 0, shown.stderr
    for key, value in settings.items():
        assert f"{key} = {value!r}  (file:{out})" in shown.stdout


def test_tune_of_an_unknown_model_is_one_line_and_exit_2():
    run = aieng("tune", "no-such-model")
    assert run.returncode == 2
    want = f"aieng tune: no model 'no-such-model' with a version under {MODELS}"
    assert run.stderr.strip().splitlines() == [want]
