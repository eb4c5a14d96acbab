"""The model pool's pure rules: the pool setting, LRU eviction under a budget, cold-start waiters."""
import pytest

from aieng.frontend.versions.pool import ColdStarts, Pool, cold_start_message, refusal
from aieng.models.settings import PoolSetting, parse_setting

A, B, C, P = ("a", "1"), ("b", "1"), ("c", "1"), ("pinned", "1")


def test_setting_defaults_to_eager_and_pinned():
    assert parse_setting(None, "m.yaml") == PoolSetting(lazy=False, pinned=False)
    assert parse_setting(None, "m.yaml").evictable is False


def test_only_lazy_unpinned_is_evictable():
    assert parse_setting({"lazy": True}, "m.yaml").evictable is True
    assert parse_setting({"lazy": True, "pinned": True}, "m.yaml").evictable is False
    assert parse_setting({"pinned": False}, "m.yaml").evictable is False  # eager: never evicted


@pytest.mark.parametrize("raw", [{"lazy": "yes"}, {"lazy": True, "size": 3}, ["lazy"], {"pinned": 1}])
def test_malformed_setting_is_refused_naming_the_file(raw):
    with pytest.raises(ValueError, match="m.yaml: pool"):
        parse_setting(raw, "m.yaml")


def test_no_budget_never_evicts():
    pool = Pool(0)
    pool.loaded(A, 10**12, evictable=True, now=0.0)
    assert pool.plan(B, 10**12, 0.0) == []


def test_fits_without_eviction():
    pool = Pool(100)
    pool.loaded(A, 40, evictable=True, now=0.0)
    assert pool.plan(B, 60, 0.0) == []


def test_evicts_least_recently_used_first():
    pool = Pool(100)
    pool.loaded(A, 40, evictable=True, now=0.0)
    pool.loaded(B, 40, evictable=True, now=0.0)
    pool.touch(A, 0.0)  # B is now the least recently used
    assert pool.order() == [B, A]
    assert pool.plan(C, 40, 0.0) == [B]


def test_evicts_as_many_as_needed():
    pool = Pool(100)
    for key in (A, B, C):
        pool.loaded(key, 30, evictable=True, now=0.0)
    assert pool.plan(("d", "1"), 80, 0.0) == [A, B, C]


def test_pinned_and_busy_versions_are_never_evicted():
    pool = Pool(110)
    pool.loaded(P, 40, evictable=False, now=0.0)
    pool.loaded(A, 30, evictable=True, now=0.0)
    pool.loaded(B, 30, evictable=True, now=0.0)
    pool.begin(A)
    assert pool.plan(C, 40, 0.0) == [B]
    assert pool.stuck(C, 0.0) == 70


def test_cannot_fit_returns_none():
    pool = Pool(100)
    pool.loaded(P, 80, evictable=False, now=0.0)
    assert pool.plan(A, 30, 0.0) is None
    assert pool.plan(A, 20, 0.0) == []


def test_busy_version_becomes_evictable_when_its_requests_end():
    pool = Pool(50)
    pool.loaded(A, 40, evictable=True, now=0.0)
    pool.begin(A)
    assert pool.plan(B, 40, 0.0) is None
    pool.end(A)
    assert pool.plan(B, 40, 0.0) == [A]


def test_reloading_a_resident_version_does_not_count_itself():
    pool = Pool(50)
    pool.loaded(A, 40, evictable=True, now=0.0)
    assert pool.plan(A, 40, 0.0) == []


def test_measured_footprint_survives_unload_as_the_estimate():
    pool = Pool(100)
    assert pool.estimate(A, 7) == 7
    pool.loaded(A, 33, evictable=True, now=0.0)
    pool.unloaded(A)
    assert not pool.resident(A)
    assert pool.used() == 0
    assert pool.estimate(A, 7) == 33


def test_negative_budget_is_refused():
    with pytest.raises(ValueError):
        Pool(-1)


def test_cold_start_waiters_are_bounded_and_released_in_order():
    cold: ColdStarts[str] = ColdStarts(max_waiting=2)
    assert cold.start(A) is True
    assert cold.start(A) is False  # one load at a time per version
    assert cold.add(A, 10.0, "r1") and cold.add(A, 20.0, "r2")
    assert cold.add(A, 30.0, "r3") is False
    assert cold.ready(A) == ["r1", "r2"]
    assert cold.loading(A) is False


def test_cold_start_waiters_past_their_deadline_expire():
    cold: ColdStarts[str] = ColdStarts(max_waiting=4)
    cold.start(A)
    cold.add(A, 5.0, "short")
    cold.add(A, 50.0, "long")
    assert cold.expired(10.0) == [(A, "short")]
    assert cold.waiting(A) == 1
    assert cold.failed(A) == ["long"]


def test_messages_name_the_model_and_the_settings():
    assert cold_start_message("tab") == "model tab is loading (cold start), not ready within the deadline"
    busy = refusal("tab", "1", 10, 20, 15, 30.0)
    assert "needs 10 bytes; the memory budget is 20 bytes, 15 in use" in busy
    assert "AIENG_POOL_WARM_S" in busy and "AIENG_MODEL_MEMORY_BUDGET" in busy
    assert refusal("tab", "1", 30, 20, 0, 30.0) == ("model tab version 1 needs 30 bytes, more than the whole "
                                                    "memory budget of 20 bytes (AIENG_MODEL_MEMORY_BUDGET)")
    retried = refusal("tab", "1", 30, 20, 0, 30.0, 42.0)
    assert "measured again 42s from now (AIENG_POOL_REMEASURE_S)" in retried


def test_rss_bytes_sees_memory_the_process_touches():
    import mmap

    from aieng.runtime.footprint import rss_bytes

    before = rss_bytes()
    block = mmap.mmap(-1, 64 << 20)  # fresh anonymous pages (a heap block could reuse resident memory)
    block.write(b"x" * (64 << 20))  # written, so resident
    grown = rss_bytes() - before
    block.close()
    assert grown >= 32 << 20


# -- the wiring's pure parts: reservations, busy versions, footprints, the model.yaml key, config ----
def test_a_reservation_counts_against_the_budget_and_is_never_evicted():
    pool = Pool(100)
    pool.reserve(A, 60)  # loading
    assert pool.plan(B, 50, 0.0) is None  # A is not evictable while it loads
    pool.loaded(A, 30, evictable=True, now=0.0)  # measured: the reservation is replaced
    assert pool.used() == 30 and pool.plan(B, 50, 0.0) == []
    pool.reserve(C, 70)
    pool.unloaded(C)  # a failed load gives its reservation back
    assert pool.used() == 30


def test_busy_versions_come_from_the_request_table():
    pool = Pool(100)
    pool.loaded(A, 60, evictable=True, now=0.0)
    pool.set_inflight({A: 2})
    assert pool.plan(B, 60, 0.0) is None
    pool.set_inflight({})  # absent: nothing in flight
    assert pool.plan(B, 60, 0.0) == [A]


def test_each_new_measurement_replaces_the_last_and_none_keeps_it():
    """Finding 15: the largest reading was kept for good, so one inflated by a concurrent load stayed."""
    pool = Pool(100)
    pool.loaded(A, 90, evictable=True, now=0.0)  # a bad reading
    pool.unloaded(A)
    pool.loaded(A, 35, evictable=True, now=1.0)  # a later good one replaces it
    assert pool.used() == 35 and pool.estimate(A, 0) == 35
    pool.unloaded(A)
    pool.loaded(A, 0, evictable=True, now=2.0, default=7)  # not measured (overlapped): the last stands
    assert pool.used() == 35 and pool.need(A, 7, 3.0) == 35
    pool.loaded(B, 0, evictable=True, now=2.0, default=7)  # never measured: the caller's estimate
    assert pool.used() == 42 and pool.estimate(B, 0) == 0


def test_a_warm_version_is_not_evicted_for_a_cold_load():
    """Finding 14: a version with a request in the last ``warm_s`` keeps its place; the load is refused."""
    pool = Pool(100, warm_s=30.0)
    pool.loaded(A, 40, evictable=True, now=0.0)
    pool.loaded(B, 40, evictable=True, now=0.0)
    assert pool.warm(A, 10.0) and pool.plan(C, 40, 10.0) is None
    assert pool.stuck(C, 10.0) == 80
    pool.touch(B, 25.0)  # B in steady use, A idle since its load
    assert pool.plan(C, 40, 31.0) == [A]  # the least recently used of the cold ones
    assert pool.plan(C, 80, 31.0) is None  # B is still warm: never evicted to fit more
    assert pool.plan(C, 80, 55.0) == [A, B]
    assert not pool.warm(C, 10.0)  # not resident: never warm


def test_a_measurement_above_the_whole_budget_is_tried_again_after_remeasure_s():
    """Finding 15: a version once measured above the budget was refused until a restart."""
    pool = Pool(100, remeasure_s=60.0)
    pool.loaded(A, 150, evictable=True, now=0.0)
    pool.unloaded(A)
    assert pool.need(A, 40, 10.0) == 150 and pool.plan(A, 150, 10.0) is None
    assert pool.retry_in(A, 10.0) == 50.0
    assert pool.measured(A) == 0  # never an estimate for its siblings
    assert pool.need(A, 40, 60.0) == 40  # tried again with the caller's estimate
    pool.loaded(A, 35, evictable=True, now=61.0)  # and measured again
    assert pool.need(A, 40, 62.0) == 35 and pool.retry_in(A, 62.0) is None and pool.measured(A) == 35


def test_the_budgeted_footprint_is_the_executors_gpu_growth_else_its_rss_growth():
    from aieng.frontend.versions.poolctl import footprint_of

    assert footprint_of({"executor": 50, "pre-0": 9, "post-0": 1}) == 50
    assert footprint_of({"executor": 50, "executor:gpu": 700, "pre-0": 9}) == 700
    assert footprint_of({"executor": 50, "executor:gpu": 0}) == 50
    assert footprint_of({"pre-0": 9}) == 0  # no executor report: the caller estimates


@pytest.fixture
def lazy_repo(tmp_path):
    import os
    import shutil

    src = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tabular", "1")
    if not os.path.isfile(os.path.join(src, "model.onnx")):
        pytest.skip("demo models missing: run scripts/fetch_models.py")
    shutil.copytree(src, tmp_path / "repo" / "tab" / "1")
    return tmp_path / "repo"


def test_the_pool_key_is_accepted_in_the_model_wide_yaml(lazy_repo):
    from aieng.models.repo import scan

    assert scan(str(lazy_repo))["tab"]["1"].pool == PoolSetting(lazy=False, pinned=False)
    (lazy_repo / "tab" / "model.yaml").write_text("pool: {lazy: true, pinned: true}\n")
    assert scan(str(lazy_repo))["tab"]["1"].pool == PoolSetting(lazy=True, pinned=True)


def test_a_malformed_pool_key_fails_the_scan_naming_the_file(lazy_repo):
    from aieng.models.repo import ModelError, scan

    (lazy_repo / "tab" / "model.yaml").write_text("pool: {lazy: maybe}\n")
    with pytest.raises(ModelError, match=r"tab/model.yaml: pool.lazy must be true or false"):
        scan(str(lazy_repo))


def test_a_pipeline_and_its_steps_cannot_be_lazy():
    from types import SimpleNamespace

    from aieng.models.repo import ModelError, check_pipeline_models
    from aieng.models.sections import Pipeline, PipelineStep

    def spec(pipeline=None, lazy=False):
        return SimpleNamespace(pipeline=pipeline, path="/r/x/1", pool=PoolSetting(lazy=lazy, pinned=False))

    steps = Pipeline((PipelineStep("detect", model="det"),))
    check_pipeline_models({"ocr": {"1": spec(steps)}, "det": {"1": spec()}})
    with pytest.raises(ModelError, match="names model 'det', which is lazy"):
        check_pipeline_models({"ocr": {"1": spec(steps)}, "det": {"1": spec(lazy=True)}})
    with pytest.raises(ModelError, match="a pipeline model cannot be lazy"):
        check_pipeline_models({"ocr": {"1": spec(steps, lazy=True)}, "det": {"1": spec()}})


def test_the_budget_is_read_from_the_environment_and_cold_versions_never_are(tmp_path):
    from aieng.config import INTERNAL, load_config

    assert load_config(environ={}).model_memory_budget == 0
    assert (load_config(environ={}).pool_warm_s, load_config(environ={}).pool_remeasure_s) == (30.0, 60.0)
    assert load_config(environ={"AIENG_POOL_WARM_S": "0"}).pool_warm_s == 0.0
    with pytest.raises(ValueError, match="pool_warm_s must be in 0..86400"):
        load_config(environ={"AIENG_POOL_WARM_S": "nan"})
    assert load_config(environ={"AIENG_MODEL_MEMORY_BUDGET": "1048576"}).model_memory_budget == 1 << 20
    with pytest.raises(ValueError, match="model_memory_budget must be >= 0"):
        load_config(environ={"AIENG_MODEL_MEMORY_BUDGET": "-1"})
    assert "cold_versions" in INTERNAL  # the supervisor fills it in per spawn
    with pytest.raises(ValueError, match="unknown environment variable AIENG_COLD_VERSIONS"):
        load_config(environ={"AIENG_COLD_VERSIONS": "tab:1"})
    path = tmp_path / "aieng.yaml"
    path.write_text("cold_versions: [tab:1]\n")
    with pytest.raises(ValueError, match="unknown setting 'cold_versions'"):
        load_config(str(path), environ={})
