"""What keeps a run-time load from delaying requests: a preprocess worker building a version is out of
the rotation while another can serve (``Workers.resting``), and builds only after the tasks that came
in the same drain (``Versions(defer=True)``), on a thread at nice 10; the executor builds beside serving
at idle priority (``AIENG_LOAD_PRIORITY``); a cold load, which a request waits for, at normal priority."""
from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace

from aieng.config import Config
from aieng.frontend.control.workers import Workers
from aieng.gpu_executor.builder import SessionBuilder
from aieng.gpu_executor.inline_post import InlinePost
from aieng.gpu_executor.inline_pre import InlinePre
from aieng.gpu_executor.sessions import ModelSession
from aieng.runtime.worker_hotswap import Versions, lower_priority
from aieng.wire import messages as m
from tests.unit.demo import needs_demo_models
from tests.unit.demo import spec as demo_spec


def two_preprocess_workers() -> Workers:
    w = Workers()
    for i, name in enumerate(("pre-0", "pre-1")):
        w.hello(m.Hello(name, "preprocess", 100 + i), now=0.0)
    return w


def test_a_resting_worker_is_not_picked_while_another_is_live():
    w = two_preprocess_workers()
    w.resting.add("pre-0")
    assert {w.pick("preprocess", 1.0, lambda n: 0) for _ in range(6)} == {"pre-1"}


def test_when_every_worker_rests_one_is_picked_all_the_same():
    w = two_preprocess_workers()
    w.resting.update({"pre-0", "pre-1"})
    assert {w.pick("preprocess", 1.0, lambda n: 0) for _ in range(6)} == {"pre-0", "pre-1"}


@needs_demo_models
def test_a_deferred_load_is_built_after_the_drain_not_when_it_arrives():
    order: list[str] = []
    sent: list = []
    worker = SimpleNamespace(handlers={}, worker="pre-0", role="preprocess", log=logging.getLogger("t"),
                             info=dict, send=lambda msg: sent.append(msg),
                             hello_msg=lambda: m.Hello("pre-0", "preprocess", 1))
    v = Versions(worker.worker, worker.send, lambda: None, worker.log, {}, {},
                 build=lambda spec, urgent: order.append(f"build {spec.key}") or object(), defer=True)
    worker.handlers.update(v.handlers)
    spec = demo_spec("tabular")
    worker.handlers[m.LoadVersion](m.LoadVersion(spec), [])
    order.append("tasks of the drain")
    assert sent == []  # nothing built or answered yet
    v.build_deferred()
    assert order == ["tasks of the drain", f"build {spec.key}"]
    assert [(type(x).__name__, x.key) for x in sent] == [("VersionLoaded", spec.key)]


def sched(tid: int) -> tuple[int, int]:
    """(scheduling policy, nice value) of one thread."""
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


def on_a_thread(fn) -> dict:
    """Run ``fn(seen)`` on a fresh thread (a lowered thread stays lowered: never this test's own)."""
    seen: dict = {}
    t = threading.Thread(target=fn, args=(seen,))
    t.start()
    t.join(120)
    assert not t.is_alive()
    return seen


def test_lower_priority_lowers_the_calling_thread_only():
    mine = sched(threading.get_native_id())

    def body(seen: dict) -> None:
        lower_priority(idle=True)
        seen["idle"] = sched(threading.get_native_id())

    def low(seen: dict) -> None:
        lower_priority(idle=False)
        seen["low"] = sched(threading.get_native_id())

    assert on_a_thread(body)["idle"] == (os.SCHED_IDLE, max(10, mine[1]))
    assert on_a_thread(low)["low"] == (os.SCHED_OTHER, max(10, mine[1]))
    assert sched(threading.get_native_id()) == mine


@needs_demo_models
def test_a_deferred_load_builds_on_a_nice_thread_and_a_cold_one_inline_at_the_workers_priority():
    mine = threading.get_native_id(), *sched(threading.get_native_id())
    seen: dict = {}

    def build(spec, urgent: bool):
        tid = threading.get_native_id()
        seen[spec.key] = (urgent, tid, *sched(tid))
        return object()

    sent: list = []
    worker = SimpleNamespace(handlers={}, worker="pre-0", role="preprocess", log=logging.getLogger("t"),
                             info=dict, send=lambda msg: sent.append(msg),
                             hello_msg=lambda: m.Hello("pre-0", "preprocess", 1))
    v = Versions(worker.worker, worker.send, lambda: None, worker.log, {}, {}, build=build, defer=True)
    worker.handlers.update(v.handlers)
    swap, cold = demo_spec("tabular"), demo_spec("minilm")
    worker.handlers[m.LoadVersion](m.LoadVersion(swap), [])
    worker.handlers[m.LoadVersion](m.LoadVersion(cold, urgent=True), [])
    v.build_deferred()
    urgent, tid, policy, nice = seen[swap.key]
    assert (urgent, policy, nice) == (False, os.SCHED_OTHER, max(10, mine[2]))
    assert tid != mine[0]  # a thread of its own: the worker's thread keeps its priority
    assert seen[cold.key] == (True, *mine)  # the worker's own thread: a request waits for it
    assert sorted(x.key for x in sent if isinstance(x, m.VersionLoaded)) == sorted([swap.key, cold.key])


def executor_build(urgent: bool) -> dict:
    """A run-time build of tabular by the executor's own code, on a fresh thread: its session and the
    thread's (policy, nice) afterwards."""
    builder = SessionBuilder(Config(intra_op_threads=1, load_priority="idle"), logging.getLogger("t"),
                             InlinePost(200), InlinePre(4096, 1 << 20))

    def body(seen: dict) -> None:
        seen["sess"] = builder.build(demo_spec("tabular"), wide=False, background=True, urgent=urgent)
        seen["sched"] = sched(threading.get_native_id())

    seen = on_a_thread(body)
    assert isinstance(seen["sess"], ModelSession)
    assert builder.wide == {}  # no wide session at run time
    return seen


@needs_demo_models
def test_the_executor_builds_a_swap_at_idle_priority():
    mine = sched(threading.get_native_id())
    assert executor_build(urgent=False)["sched"] == (os.SCHED_IDLE, max(10, mine[1]))


@needs_demo_models
def test_the_executor_builds_a_cold_load_at_the_threads_own_priority():
    mine = sched(threading.get_native_id())
    assert executor_build(urgent=True)["sched"] == mine
