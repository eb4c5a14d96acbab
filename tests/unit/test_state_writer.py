"""The routing state writer (issue 20, finding 10): the loop hands a snapshot over and goes on at once; one
thread writes; at most one write runs and one waits (latest wins); tickets say whether the file holds
their change; a failed write is retried; close writes what waits.  The save is a fake that blocks on an
event, so "the loop went on before the write ended" is shown by order, not by time."""
from __future__ import annotations

import select
import threading

import pytest

from aieng.frontend.rollout.statewriter import StateWriter, Ticket
from tests.waits import until


class FakeSave:
    """Records what it was asked to write; each call waits for ``release`` (set: writes pass at once)."""

    def __init__(self, blocked: bool = True):
        self.saved: list = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail: Exception | None = None
        if not blocked:
            self.release.set()

    def __call__(self, snapshot) -> None:
        self.started.set()
        assert self.release.wait(10), "the test never released the write"
        if self.fail is not None:
            raise self.fail
        self.saved.append(snapshot)


def deliver(w: StateWriter, tickets: list[Ticket], timeout: float = 10.0) -> bool:
    """Run the loop's side (wait for the wake-up fd, poll) until every ticket is done."""
    def done() -> bool:
        if select.select([w.fileno()], [], [], 0.05)[0]:
            w.poll()
        return all(t.done for t in tickets)
    return until(done, timeout, 0.0)


@pytest.fixture
def writers():
    made: list[StateWriter] = []

    def make(save, **kw) -> StateWriter:
        w = StateWriter(save, "/state/routing.json", **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close(5)


def test_submit_returns_before_the_write_ends_and_a_burst_costs_two_writes(writers):
    save = FakeSave()
    w = writers(save)
    t1 = w.submit("s1")
    assert save.started.wait(10)  # s1 is being written, and submit has returned: the loop goes on
    assert not t1.done and save.saved == []
    t2, t3 = w.submit("s2"), w.submit("s3")  # while s1's write runs: s3 replaces s2, nothing else starts
    answers: list = []
    for name, t in (("t1", t1), ("t2", t2), ("t3", t3)):
        t.then(lambda err, name=name: answers.append((name, err)))
    save.release.set()
    assert deliver(w, [t1, t2, t3])
    assert save.saved == ["s1", "s3"]  # s2 was never written: s3 holds every change it did
    assert sorted(answers) == [("t1", None), ("t2", None), ("t3", None)]


def test_callbacks_run_only_in_poll_on_the_loops_thread(writers):
    w = writers(FakeSave(blocked=False))
    threads: list = []
    t = w.submit("s1")
    t.then(lambda err: threads.append(threading.current_thread()))
    assert until(lambda: select.select([w.fileno()], [], [], 0.05)[0], 10, 0.0)
    assert threads == []  # written, but nothing runs until the loop polls
    w.poll()
    assert threads == [threading.current_thread()] and t.done and t.error is None


def test_a_failed_write_errs_its_tickets_counts_and_is_retried_until_it_succeeds(writers):
    save = FakeSave(blocked=False)
    save.fail = OSError(28, "No space left on device")
    counted: list[str] = []
    w = writers(save, count=counted.append, retry_s=0.05)
    t = w.submit("s1")
    assert deliver(w, [t])
    assert t.error == "could not save routing state to /state/routing.json: No space left on device"
    assert until(lambda: counted.count("failed") >= 2, 10)  # retried without a new hand-over
    again = w.barrier()  # something is unsaved: not done at once
    assert not again.done
    save.fail = None
    assert deliver(w, [again]) and again.error is None
    assert save.saved[-1] == "s1" and counted[-1] == "ok"
    assert w.barrier().done  # the file holds everything now: done at once


def test_a_barrier_waits_for_the_write_under_way(writers):
    save = FakeSave()
    w = writers(save)
    w.submit("s1")
    assert save.started.wait(10)
    b = w.barrier()
    assert not b.done
    save.release.set()
    assert deliver(w, [b]) and b.error is None and save.saved == ["s1"]


def test_flush_waits_for_what_was_handed_over(writers):
    save = FakeSave()
    w = writers(save)
    w.submit("s1")
    assert save.started.wait(10)
    w.submit("s2")
    assert w.flush(0.05) is False  # s1 is held by the test: not written yet
    save.release.set()
    assert w.flush(10) is True and save.saved == ["s1", "s2"]


def test_close_writes_what_waits(writers):
    save = FakeSave()
    w = StateWriter(save, "/state/routing.json")
    w.submit("s1")
    assert save.started.wait(10)
    w.submit("s2")
    save.release.set()
    w.close(10)
    assert save.saved == ["s1", "s2"] and not w.thread.is_alive()
