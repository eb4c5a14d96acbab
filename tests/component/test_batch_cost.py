"""Where a version's answers come from decides what its batches cost the executor's batcher: a real
``Executor`` loading the penguins example (its ``post`` is user code, answered by the postprocess pool) beside
the built-in tabular model (its chain answered in the executor): only the first pays a hand-off per batch
(``HANDOFF_S``, ``Batcher.batch_cost``), in the serving batcher and the background one alike."""
from __future__ import annotations

import logging

from aieng.config import Config
from aieng.gpu_executor.executor import HANDOFF_S, Executor
from aieng.models.repo import load_spec
from tests.e2e.test_examples import build_examples
from tests.unit.demo import needs_demo_models
from tests.unit.demo import spec as demo_spec

pytestmark = needs_demo_models
log = logging.getLogger("test")


def test_only_a_version_answered_by_the_postprocess_pool_pays_a_hand_off_per_batch(tmp_path):
    version = build_examples(tmp_path / "examples") / "penguins" / "1"
    specs = {"penguins:1": load_spec("penguins", "1", str(version), allow_code=True),
             "tabular:1": demo_spec("tabular")}
    ex = Executor(Config(runtime_dir=str(tmp_path), postprocess_workers=1), specs, "executor", log)
    try:
        assert ex.inline.advertised() == ["tabular:1"]  # the built-in's chain answers in the executor
        for batcher in (ex.batcher, ex.bg_batcher):
            assert batcher.queues["penguins:1"].fixed_s == HANDOFF_S
            assert batcher.queues["tabular:1"].fixed_s == 0.0
    finally:
        ex.close()
