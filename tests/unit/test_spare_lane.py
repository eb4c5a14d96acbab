"""The executor's spare lane: while every serving lane runs a flooded model's long batches, a model whose
batches run at most a quarter as long takes one more thread at once instead of waiting out a batch (issue 33's
note: a rarely asked model waited 7x longer beside a flooded one; ``crowded`` keeps a lane only for recent
models)."""
from __future__ import annotations

import threading

from aieng.gpu_executor.batcher import SPARE_RATIO, Batcher, Pending
from aieng.gpu_executor.lanes import Job, Lanes
from tests.unit.test_background_lane import wait_finished


def P(rid: int, arrived: float) -> Pending:
    return Pending(rid, 0, arrived, float("inf"))


def flooded() -> Batcher:
    b = Batcher()
    b.add_model("minilm:1", 8, 5.0, 0.3)
    b.add_model("tabular:1", 8, 5.0, 0.3)
    b.observe("minilm:1", 8, 0, 0.040)
    b.observe("tabular:1", 1, 0, 0.0005)
    return b


def test_a_fast_model_beside_lanes_full_of_a_slow_one_may_take_the_spare_lane():
    b = flooded()
    b.put("tabular:1", P(1, arrived=100.0), upstream=0)  # rarely asked: long past the sharing window
    assert b.spare_models({"minilm:1": 2}) == {"tabular:1"}
    key, batch, _ = b.next_batch(now=100.001, only=b.spare_models({"minilm:1": 2}))
    assert (key, [p.rid for p in batch]) == ("tabular:1", [1])


def test_the_spare_lane_is_not_for_the_flooded_model_itself_nor_a_model_about_as_slow():
    b = flooded()
    b.add_model("textrec:1", 8, 5.0, 0.3)
    b.observe("textrec:1", 8, 0, 0.040 / SPARE_RATIO * 1.5)  # faster, but not by the ratio
    for i in range(8):
        b.put("minilm:1", P(i, arrived=1.0), upstream=0)
    b.put("textrec:1", P(20, arrived=1.0), upstream=0)
    assert b.spare_models({"minilm:1": 2}) == set()
    key, batch, wake = b.next_batch(now=9.0, only=set())
    assert (key, batch) == (None, [])


def test_no_spare_lane_beside_a_model_not_measured_yet_or_for_one():
    b = flooded()
    b.add_model("fresh:1", 1, 5.0, 0.3)
    b.put("fresh:1", P(1, arrived=1.0), upstream=0)
    b.put("tabular:1", P(2, arrived=1.0), upstream=0)
    assert b.spare_models({"minilm:1": 2}) == {"tabular:1"}  # fresh's run could be long: not on the spare
    assert b.spare_models({"fresh:1": 1, "minilm:1": 1}) == set()  # a running model's length is unknown
    assert b.spare_models({}) == set()


def test_a_spare_job_runs_on_its_own_thread_and_leaves_the_serving_count_alone():
    lanes = Lanes(1, spare=True)
    release = threading.Event()
    try:
        lanes.submit(Job(lambda: release.wait(10) and threading.current_thread().name, None, key="minilm:1"))
        assert (lanes.free(), lanes.spare_free(), dict(lanes.running)) == (0, True, {"minilm:1": 1})
        lanes.submit(Job(lambda: threading.current_thread().name, None, key="tabular:1", spare=True))
        assert lanes.spare_free() is False
        (spare_job,) = wait_finished(lanes, 1)  # while the serving lane is still held
        assert (spare_job.result, spare_job.spare) == ("lane-spare", True)
        assert (lanes.free(), lanes.spare_free(), dict(lanes.running)) == (0, True, {"minilm:1": 1})
        release.set()
        (serving,) = wait_finished(lanes, 1)
        assert serving.result == "lane-0"
        assert (lanes.free(), dict(lanes.running)) == (1, {})
    finally:
        release.set()
        lanes.close()


def test_without_the_setting_there_is_no_spare_lane():
    lanes = Lanes(1)
    try:
        assert lanes.spare_free() is False
        assert [t.name for t in lanes.threads] == ["lane-0", "lane-bg"]
    finally:
        lanes.close()
