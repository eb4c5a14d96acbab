"""Unit tests for aieng/gpu_executor/batcher.py: length-aware dynamic batching."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng.gpu_executor.batcher import Batcher, Pending, padding_waste

INF = math.inf


def P(rid: int, seq_len: int, arrived: float, deadline: float = INF) -> Pending:
    return Pending(rid=rid, seq_len=seq_len, arrived=arrived, deadline=deadline)


def batcher(key: str = "m:1", max_batch_size: int = 8, max_wait_ms: float = 5.0,
            max_padding_waste: float = 0.3) -> Batcher:
    b = Batcher()
    b.add_model(key, max_batch_size, max_wait_ms, max_padding_waste)
    return b


def rids(batch) -> list[int]:
    return [p.rid for p in batch]


# ------------------------------------------------------------ padding_waste
@pytest.mark.parametrize("lengths, expected", [
    ([], 0.0),
    ([0], 0.0),
    ([0, 0, 0], 0.0),
    ([7], 0.0),
    ([5, 5, 5], 0.0),
    ([10, 20], 0.25),
    ([1, 3], 1 - 4 / 6),
    ([0, 10], 0.5),
    ([1, 100], 1 - 101 / 200),
])
def test_padding_waste(lengths, expected):
    assert padding_waste(lengths) == pytest.approx(expected)


# ------------------------------------------------------------ selection
def test_oldest_request_anchors_the_batch():
    """A long request that arrived first is never overtaken by a crowd of short ones."""
    b = batcher(max_batch_size=4, max_padding_waste=0.3)
    b.put("m:1", P(0, 100, arrived=0.0), upstream=0)
    for i in range(1, 11):
        b.put("m:1", P(i, 10, arrived=float(i)), upstream=0)
    key, batch, wake = b.next_batch(now=20.0)
    assert key == "m:1" and wake is None
    assert rids(batch) == [0], "short ones would waste too much padding next to the long anchor"
    _, batch, _ = b.next_batch(now=20.0)
    assert rids(batch) == [1, 2, 3, 4]
    _, batch, _ = b.next_batch(now=20.0)
    assert rids(batch) == [5, 6, 7, 8]


def test_short_anchor_is_not_starved_by_long_stream():
    b = batcher(max_batch_size=4, max_padding_waste=0.1)
    b.put("m:1", P(0, 5, arrived=0.0), upstream=0)
    for i in range(1, 9):
        b.put("m:1", P(i, 120, arrived=float(i)), upstream=0)
    _, batch, _ = b.next_batch(now=10.0)
    assert rids(batch) == [0]


def test_nearest_lengths_chosen_within_waste_bound():
    b = batcher(max_batch_size=3, max_padding_waste=0.3)
    b.put("m:1", P(0, 50, 0.0), upstream=0)
    for rid, (n, t) in enumerate([(10, 1.0), (48, 2.0), (52, 3.0), (90, 4.0), (51, 5.0), (30, 6.0)], start=1):
        b.put("m:1", P(rid, n, t), upstream=0)
    _, batch, _ = b.next_batch(now=10.0)
    # 51 is nearest; 48 and 52 tie at distance 2 and the earlier arrival (48) wins.
    assert [p.seq_len for p in batch] == [50, 51, 48]
    assert padding_waste([p.seq_len for p in batch]) <= 0.3


def test_waste_bound_is_inclusive_and_excludes_beyond():
    b = batcher(max_batch_size=8, max_padding_waste=0.25)
    b.put("m:1", P(0, 10, 0.0), upstream=0)
    b.put("m:1", P(1, 20, 1.0), upstream=0)  # waste exactly 0.25: allowed
    b.put("m:1", P(2, 40, 2.0), upstream=0)  # [10, 20, 40]: waste 0.4167
    _, batch, _ = b.next_batch(now=5.0)
    assert rids(batch) == [0, 1]
    _, batch, _ = b.next_batch(now=5.0)
    assert rids(batch) == [2]


def test_zero_waste_groups_equal_lengths_only():
    b = batcher(max_batch_size=8, max_padding_waste=0.0)
    for rid, n in enumerate([7, 8, 7, 9, 7]):
        b.put("m:1", P(rid, n, float(rid)), upstream=0)
    _, batch, _ = b.next_batch(now=10.0)
    assert rids(batch) == [0, 2, 4]


def test_fixed_shape_models_batch_everything():
    b = batcher(max_batch_size=8, max_padding_waste=0.0)
    for rid in range(5):
        b.put("m:1", P(rid, 0, float(rid)), upstream=0)
    _, batch, _ = b.next_batch(now=10.0)
    assert rids(batch) == [0, 1, 2, 3, 4]


def test_max_batch_size_respected():
    b = batcher(max_batch_size=8)
    for rid in range(20):
        b.put("m:1", P(rid, 16, float(rid)), upstream=0)
    sizes = []
    while b.pending():
        _, batch, _ = b.next_batch(now=100.0)
        sizes.append(len(batch))
    assert sizes == [8, 8, 4]


def test_max_batch_size_one():
    b = batcher(max_batch_size=1)
    for rid in range(3):
        b.put("m:1", P(rid, 16, float(rid)), upstream=5)
    for rid in range(3):
        _, batch, _ = b.next_batch(now=0.0)  # a batch of one is always full
        assert rids(batch) == [rid]


# ------------------------------------------------------------ when to run
def test_full_batch_runs_at_once_even_with_upstream():
    b = batcher(max_batch_size=4, max_wait_ms=50.0)
    for rid in range(4):
        b.put("m:1", P(rid, 10, 1.0 + rid * 1e-4), upstream=10)
    key, batch, wake = b.next_batch(now=1.001)
    assert key == "m:1" and rids(batch) == [0, 1, 2, 3] and wake is None


def test_non_full_batch_with_upstream_waits_until_max_wait():
    b = batcher(max_batch_size=4, max_wait_ms=5.0)
    b.put("m:1", P(0, 10, arrived=1.0), upstream=3)
    b.put("m:1", P(1, 10, arrived=1.001), upstream=2)
    key, batch, wake = b.next_batch(now=1.002)
    assert key is None and batch == []
    assert wake == pytest.approx(1.005)
    assert b.pending() == 2, "waiting must not consume anything"
    key, batch, wake = b.next_batch(now=1.0049)
    assert key is None and wake == pytest.approx(1.005)
    key, batch, wake = b.next_batch(now=wake)  # at the deadline it runs
    assert key == "m:1" and rids(batch) == [0, 1] and wake is None


def test_upstream_zero_runs_at_once():
    b = batcher(max_batch_size=4, max_wait_ms=1000.0)
    b.put("m:1", P(0, 10, arrived=1.0), upstream=0)
    key, batch, wake = b.next_batch(now=1.0)
    assert key == "m:1" and rids(batch) == [0] and wake is None


def test_upstream_is_the_latest_put_value():
    b = batcher(max_batch_size=4, max_wait_ms=1000.0)
    b.put("m:1", P(0, 10, arrived=1.0), upstream=1)
    assert b.next_batch(now=1.0)[0] is None
    b.put("m:1", P(1, 10, arrived=1.1), upstream=0)  # the last one in flight has arrived
    key, batch, _ = b.next_batch(now=1.1)
    assert rids(batch) == [0, 1]


def test_queue_of_max_size_runs_even_when_waste_keeps_batch_small():
    b = batcher(max_batch_size=2, max_wait_ms=1000.0, max_padding_waste=0.1)
    b.put("m:1", P(0, 10, 1.0), upstream=5)
    b.put("m:1", P(1, 100, 1.0), upstream=5)
    key, batch, _ = b.next_batch(now=1.0)  # nothing coming could make it fuller
    assert key == "m:1" and rids(batch) == [0]


def test_empty_batcher():
    b = batcher()
    assert b.next_batch(now=0.0) == (None, [], None)
    assert b.pending() == 0 and b.expire(now=1e9) == []


# ------------------------------------------------------------ expiry
def test_expire_removes_expired_items():
    b = batcher(max_batch_size=8)
    b.add_model("other:1", 8, 5.0, 0.3)
    b.put("m:1", P(0, 10, 0.0, deadline=1.0), upstream=0)
    b.put("m:1", P(1, 10, 0.1, deadline=5.0), upstream=0)
    b.put("m:1", P(2, 10, 0.2, deadline=2.0), upstream=0)  # deadline == now: expired
    b.put("other:1", P(3, 0, 0.3, deadline=1.5), upstream=0)
    gone = b.expire(now=2.0)
    assert sorted(rids(gone)) == [0, 2, 3]
    assert b.pending() == 1
    key, batch, _ = b.next_batch(now=2.0)
    assert key == "m:1" and rids(batch) == [1], "an expired anchor must not lead the batch"
    assert b.expire(now=2.0) == []


# ------------------------------------------------------------ several models
def test_older_anchor_model_goes_first():
    b = Batcher()
    b.add_model("a:1", 8, 5.0, 0.3)
    b.add_model("b:1", 8, 5.0, 0.3)
    b.put("a:1", P(0, 10, arrived=5.0), upstream=0)
    b.put("a:1", P(1, 10, arrived=5.5), upstream=0)
    b.put("b:1", P(2, 10, arrived=3.0), upstream=0)
    key, batch, _ = b.next_batch(now=10.0)
    assert key == "b:1" and rids(batch) == [2]
    key, batch, _ = b.next_batch(now=10.0)
    assert key == "a:1" and rids(batch) == [0, 1]
    assert b.next_batch(now=10.0) == (None, [], None)


def test_runnable_model_goes_while_older_one_waits():
    b = Batcher()
    b.add_model("a:1", 8, 5.0, 0.3)
    b.add_model("b:1", 8, 5.0, 0.3)
    b.put("a:1", P(0, 10, arrived=1.0), upstream=4)  # waits for company until 1.005
    b.put("b:1", P(1, 10, arrived=1.002), upstream=0)
    key, batch, wake = b.next_batch(now=1.003)
    assert key == "b:1" and rids(batch) == [1]
    key, batch, wake = b.next_batch(now=1.003)
    assert key is None and wake == pytest.approx(1.005)


def test_wake_at_is_earliest_deadline_across_models():
    b = Batcher()
    b.add_model("a:1", 8, 10.0, 0.3)
    b.add_model("b:1", 8, 2.0, 0.3)
    b.put("a:1", P(0, 10, arrived=1.0), upstream=1)  # due 1.010
    b.put("b:1", P(1, 10, arrived=1.004), upstream=1)  # due 1.006
    assert b.next_batch(now=1.005) == (None, [], pytest.approx(1.006))


# ------------------------------------------------------------ properties
@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 200), min_size=1, max_size=40),
       max_batch=st.integers(1, 16), waste=st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]))
def test_drain_invariants(lengths, max_batch, waste):
    b = batcher(max_batch_size=max_batch, max_padding_waste=waste)
    for rid, n in enumerate(lengths):
        b.put("m:1", P(rid, n, float(rid)), upstream=0)
    seen: list[int] = []
    while b.pending():
        remaining = [p.rid for p in b.queues["m:1"].items]
        key, batch, wake = b.next_batch(now=1e6)
        assert key == "m:1" and wake is None
        assert batch[0].rid == remaining[0], "the oldest pending request anchors every batch"
        assert 1 <= len(batch) <= max_batch
        assert len(batch) == 1 or padding_waste([p.seq_len for p in batch]) <= waste + 1e-12
        seen += rids(batch)
    assert sorted(seen) == list(range(len(lengths)))


# ------------------------------------------------------------ cost model
def test_cost_model_interpolates_in_rows_and_scales_buckets():
    from aieng.gpu_executor.batcher import CostModel

    cm = CostModel()
    cm.observe(1, 16, 0.002)
    cm.observe(32, 16, 0.040)
    assert cm.estimate(1, 16) == pytest.approx(0.002)
    assert cm.estimate(16, 12) == pytest.approx(0.002 + (0.038 / 31) * 15)  # 12 -> bucket 16
    assert cm.estimate(8, 64) == pytest.approx(cm.estimate(8, 16) * 4)  # no 64 bucket: scaled
    cm.observe(1, 16, 0.004)  # EMA moves toward new measurements
    assert 0.002 < cm.estimate(1, 16) < 0.004


def test_waits_only_when_running_together_finishes_sooner():
    # CPU-like: cost linear in rows -> running now and again later is as good: run now
    b = Batcher()
    b.add_model("cpu:1", 8, 50.0, 1.0)
    for rows in (1, 8):
        b.observe("cpu:1", rows, 16, 0.005 * rows)
    b.put("cpu:1", P(0, 16, arrived=1.0), upstream=3)
    b.put("cpu:1", P(1, 16, arrived=1.001), upstream=3)
    key, batch, _ = b.next_batch(now=1.002)
    assert key == "cpu:1" and [p.rid for p in batch] == [0]  # runs now, one row: batching does not pay
    key, batch, _ = b.next_batch(now=1.002)
    assert key == "cpu:1" and [p.rid for p in batch] == [1]  # and the next at once, not after a wait
    # GPU-like: a bigger batch is nearly free and the rest is 1 ms away -> wait
    g = Batcher()
    g.add_model("gpu:1", 8, 50.0, 1.0)
    for rows in (1, 8):
        g.observe("gpu:1", rows, 16, 0.005 + 0.0001 * rows)
    g.put("gpu:1", P(0, 16, arrived=1.0), upstream=3)
    g.put("gpu:1", P(1, 16, arrived=1.001), upstream=3)
    assert g.next_batch(now=1.002)[0] is None


def _queue_with_costs(cost_of_rows) -> "Batcher":
    b = Batcher()
    b.add_model("m:1", 32, 5.0, 1.0)
    for rows in (1, 2, 4, 8, 16, 32):
        b.observe("m:1", rows, 32, cost_of_rows(rows))
    return b


def test_flat_cost_per_row_runs_small_batches():
    """CPU-like: one row costs more, then the cost per row is flat: 2 rows, not 32."""
    b = _queue_with_costs(lambda rows: 0.0099 if rows == 1 else 0.0079 * rows)
    assert Batcher.best_rows(b.queues["m:1"], [32] * 32) == 2


def test_cheaper_big_batches_grow():
    """GPU-like: a run costs about the same whatever the rows: the biggest batch."""
    b = _queue_with_costs(lambda rows: 0.005 + 0.0001 * rows)
    assert Batcher.best_rows(b.queues["m:1"], [32] * 32) >= 30  # within 5% per row of 32 rows


def test_rising_cost_per_row_runs_one():
    """Long sequences, where attention makes a row dearer in a bigger batch: one at a time."""
    b = _queue_with_costs(lambda rows: 0.0175 * rows * (1 + rows / 100))
    assert Batcher.best_rows(b.queues["m:1"], [32] * 32) == 1


def test_a_cost_each_batch_pays_besides_its_run_runs_the_rows_ready_together():
    """A run costing the same per row (a small model on a CPU) runs one row at a time; a version whose every
    batch also pays a hand-off (answered by the postprocess pool: ``batch_cost``) runs the six as one."""
    def ready(fixed_s: float) -> list[int]:
        b = Batcher()
        b.add_model("m:1", 8, 5.0, 1.0)
        b.batch_cost("m:1", fixed_s)
        for rows in (1, 2, 4, 8):
            b.observe("m:1", rows, 0, 0.00004 * rows)
        for i in range(6):
            b.put("m:1", P(i, 0, arrived=1.0 + i * 1e-6), upstream=0)
        return rids(b.next_batch(now=1.001)[1])

    assert ready(0.0) == [0]
    assert ready(0.0002) == [0, 1, 2, 3, 4, 5]


def test_a_cost_per_batch_small_beside_the_run_leaves_the_choice_as_it_was():
    """Long runs (7.9 ms a row): a 0.2 ms hand-off per batch changes nothing, still 2 rows (as above)."""
    b = _queue_with_costs(lambda rows: 0.0099 if rows == 1 else 0.0079 * rows)
    b.batch_cost("m:1", 0.0002)
    assert Batcher.best_rows(b.queues["m:1"], [32] * 32) == 2


# ------------------------------------------------------------ sharing the lanes (issue 20, finding 16)
def two_models() -> Batcher:
    b = Batcher()
    b.add_model("textrec:1", 8, 5.0, 0.3)
    b.add_model("tabular:1", 8, 5.0, 0.3)
    b.observe("textrec:1", 8, 0, 0.080)  # measured runs: textrec's batches are the long ones
    b.observe("tabular:1", 1, 0, 0.0002)
    return b


def test_a_flood_holding_all_lanes_but_one_leaves_the_last_to_a_model_active_lately():
    b = two_models()
    for i in range(20):  # the flood: older than anything the other model sends
        b.put("textrec:1", P(i, 0, arrived=0.0), upstream=0)
    b.put("tabular:1", P(100, 0, arrived=9.0), upstream=0)
    key, batch, _ = b.next_batch(now=10.0, running={"textrec:1": 1}, lanes=2)
    assert (key, rids(batch)) == ("tabular:1", [100])  # not the older textrec batch
    key, batch, wake = b.next_batch(now=10.0, running={"textrec:1": 1}, lanes=2)
    assert (key, batch) == (None, [])  # textrec waits for its own lane; the last one stays free


def test_alone_a_model_takes_every_lane():
    b = two_models()
    for i in range(16):  # two batches of 8
        b.put("textrec:1", P(i, 0, arrived=0.0), upstream=0)
    b.put("tabular:1", P(100, 0, arrived=1.0), upstream=0)
    assert b.next_batch(now=1.5)[0] == "textrec:1"  # oldest first, as ever (no lanes in use)
    assert b.next_batch(now=1.5, running={"textrec:1": 1}, lanes=2)[0] == "tabular:1"  # tabular is active
    # tabular's last request is older than SHARE_WINDOW_S: textrec may hold both lanes
    key, _, _ = b.next_batch(now=1.0 + 2.5, running={"textrec:1": 1}, lanes=2)
    assert key == "textrec:1"


def test_one_lane_is_never_withheld():
    b = two_models()
    b.put("textrec:1", P(0, 0, arrived=0.0), upstream=0)
    b.put("tabular:1", P(1, 0, arrived=0.5), upstream=0)
    assert b.crowded(1.0, {"textrec:1": 1}, lanes=1) == set()
    assert b.crowded(1.0, {"textrec:1": 1}, lanes=2) == {"textrec:1"}
    assert b.crowded(1.0, {"textrec:1": 1, "tabular:1": 1}, lanes=3) == {"textrec:1"}  # the last is kept
    assert b.crowded(1.0, {"textrec:1": 1}, lanes=3) == set()  # two are free: anyone may take one


def test_two_longer_running_models_together_keep_the_last_lane_free():
    """Before, textdet on one lane and textrec on the other held both from tabular (each held only one)."""
    b = two_models()
    b.add_model("textdet:1", 1, 5.0, 0.3)
    b.observe("textdet:1", 1, 0, 0.300)
    b.put("textrec:1", P(0, 0, arrived=0.5), upstream=0)
    b.put("tabular:1", P(1, 0, arrived=0.6), upstream=0)
    assert b.crowded(1.0, {"textdet:1": 1}, lanes=2) == {"textdet:1", "textrec:1"}
    key, batch, _ = b.next_batch(now=1.0, running={"textdet:1": 1}, lanes=2)
    assert (key, rids(batch)) == ("tabular:1", [1])


def test_a_model_not_measured_yet_counts_as_the_shortest():
    b = two_models()
    b.add_model("fresh:1", 1, 5.0, 0.3)  # no run observed yet
    b.put("fresh:1", P(0, 0, arrived=0.5), upstream=0)
    assert b.crowded(1.0, {"textrec:1": 1}, lanes=2) == {"textrec:1", "tabular:1"}


def test_a_longer_running_model_keeps_no_lane_from_a_shorter_one():
    """textrec beside its own pipeline's textdet (whose batches run longer) may take every lane."""
    b = two_models()
    b.add_model("textdet:1", 1, 5.0, 0.3)
    b.observe("textdet:1", 1, 0, 0.300)
    b.put("textdet:1", P(0, 0, arrived=0.5), upstream=0)
    b.put("textrec:1", P(1, 0, arrived=0.6), upstream=0)
    assert b.crowded(1.0, {"textrec:1": 1}, lanes=2) == {"textdet:1"}  # textrec may take the last one
    assert b.crowded(1.0, {"textdet:1": 1}, lanes=2) == {"textdet:1"}  # textrec is faster: the last is kept
