"""The model pool's pure rules: the pool setting, LRU eviction under a budget, cold-start waiters."""
import pytest

from aieng.frontend.pool import ColdStarts, Pool, PoolSetting, cold_start_message, parse_setting, refusal

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
    pool.loaded(A, 10**12, evictable=True)
    assert pool.plan(B, 10**12) == []


def test_fits_without_eviction():
    pool = Pool(100)
    pool.loaded(A, 40, evictable=True)
    assert pool.plan(B, 60) == []


def test_evicts_least_recently_used_first():
    pool = Pool(100)
    pool.loaded(A, 40, evictable=True)
    pool.loaded(B, 40, evictable=True)
    pool.touch(A)  # B is now the least recently used
    assert pool.order() == [B, A]
    assert pool.plan(C, 40) == [B]


def test_evicts_as_many_as_needed():
    pool = Pool(100)
    for key in (A, B, C):
        pool.loaded(key, 30, evictable=True)
    assert pool.plan(("d", "1"), 80) == [A, B, C]


def test_pinned_and_busy_versions_are_never_evicted():
    pool = Pool(110)
    pool.loaded(P, 40, evictable=False)
    pool.loaded(A, 30, evictable=True)
    pool.loaded(B, 30, evictable=True)
    pool.begin(A)
    assert pool.plan(C, 40) == [B]
    assert pool.stuck(C) == 70


def test_cannot_fit_returns_none():
    pool = Pool(100)
    pool.loaded(P, 80, evictable=False)
    assert pool.plan(A, 30) is None
    assert pool.plan(A, 20) == []


def test_busy_version_becomes_evictable_when_its_requests_end():
    pool = Pool(50)
    pool.loaded(A, 40, evictable=True)
    pool.begin(A)
    assert pool.plan(B, 40) is None
    pool.end(A)
    assert pool.plan(B, 40) == [A]


def test_reloading_a_resident_version_does_not_count_itself():
    pool = Pool(50)
    pool.loaded(A, 40, evictable=True)
    assert pool.plan(A, 40) == []


def test_measured_footprint_survives_unload_as_the_estimate():
    pool = Pool(100)
    assert pool.estimate(A, 7) == 7
    pool.loaded(A, 33, evictable=True)
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


def test_messages_name_the_model():
    assert cold_start_message("tab") == "model tab is loading (cold start), not ready within the deadline"
    assert "AIENG_MODEL_MEMORY_BUDGET" in refusal("tab", "1", 10, 5, 3)


def test_rss_bytes_sees_memory_the_process_touches():
    import mmap

    from aieng.worker_hotswap import rss_bytes

    before = rss_bytes()
    block = mmap.mmap(-1, 64 << 20)  # fresh anonymous pages (a heap block could reuse resident memory)
    block.write(b"x" * (64 << 20))  # written, so resident
    grown = rss_bytes() - before
    block.close()
    assert grown >= 32 << 20
