"""``Workers.pick_pre``, ``stuck``, ``pool_stalled``: a slow request's worker routed around (no processes)."""
from __future__ import annotations

from aieng.frontend.control.workers import STALL_S, Workers
from aieng.wire import messages as m

T0 = 100.0


def pool(*seen: float) -> Workers:
    """Preprocess workers pre-0.. whose last heartbeats came at ``seen``."""
    w = Workers()
    for i, at in enumerate(seen):
        w.hello(m.Hello(f"pre-{i}", "preprocess", 10 + i), at)
    return w


def test_a_stalled_worker_gets_no_other_work_while_another_is_not():
    w, load = pool(T0, T0 + STALL_S), {"pre-0": 1, "pre-1": 3}.__getitem__
    now = T0 + STALL_S + 0.1  # pre-0 is silent past STALL_S holding a request; pre-1 is busy but heartbeating
    assert w.stalled("pre-0", now, load) and not w.stalled("pre-1", now, load)
    assert {w.pick_pre(now, load, lambda n: False) for _ in range(4)} == {"pre-1"}  # not the least loaded
    assert not w.pool_stalled(now, load)


def test_an_idle_worker_silent_as_long_is_not_stalled():
    w = pool(T0, T0)
    assert not w.stalled("pre-0", T0 + STALL_S + 0.1, lambda n: 0)


def test_a_model_that_stalls_a_worker_leaves_the_last_unstalled_one_to_the_others():
    w, load = pool(T0, T0, T0 + STALL_S), {"pre-0": 2, "pre-1": 1, "pre-2": 0}.__getitem__
    now = T0 + STALL_S + 0.1
    own = {"pre-0", "pre-1"}.__contains__  # the slow model's requests are on both stalled workers
    assert {w.pick_pre(now, load, own) for _ in range(4)} == {"pre-1"}  # its own, least loaded
    assert w.pick_pre(now, load, lambda n: False) == "pre-2"  # another model's request gets the free one


def test_with_two_unstalled_workers_left_a_slow_model_may_use_either():
    w, load = pool(T0, T0 + STALL_S, T0 + STALL_S), {"pre-0": 1, "pre-1": 0, "pre-2": 0}.__getitem__
    picks = {w.pick_pre(T0 + STALL_S + 0.1, load, {"pre-0"}.__contains__) for _ in range(6)}
    assert picks == {"pre-1", "pre-2"}


def test_every_worker_stalled_the_least_loaded_takes_it_and_the_pool_reads_stalled():
    w, load = pool(T0, T0), {"pre-0": 2, "pre-1": 1}.__getitem__
    now = T0 + STALL_S + 0.1
    assert w.pick_pre(now, load, lambda n: False) == "pre-1"
    assert w.pool_stalled(now, load)
    assert not Workers().pool_stalled(now, load)  # no worker connected: restarting, not stalled


def test_stuck_names_the_workers_silent_past_the_budget_while_holding_requests():
    w = pool(T0, T0, T0 + 4)
    w.hello(m.Hello("executor", "executor", 99), T0)
    load = {"pre-0": 1, "pre-1": 0, "pre-2": 1, "executor": 5}.__getitem__
    assert w.stuck(T0 + 5.1, 5.0, load) == ["pre-0"]  # pre-1 holds nothing, pre-2 spoke lately
    w.rest("pre-0")  # building a run-time load: the hang timeout's, not the budget's
    assert w.stuck(T0 + 5.1, 5.0, load) == []
