"""The executor's background lane: a loading version's golden cases (``InferTask.background``) queue apart
and run on one more lane whose thread lowered itself (SCHED_IDLE), so the serving lanes keep the cores."""
from __future__ import annotations

import logging
import os
import select
import threading
import time
from types import SimpleNamespace

from aieng.config import Config
from aieng.gpu_executor.builder import SessionBuilder
from aieng.gpu_executor.executor import Executor
from aieng.gpu_executor.inline_post import InlinePost
from aieng.gpu_executor.inline_pre import InlinePre
from aieng.gpu_executor.lanes import Job, Lanes
from aieng.gpu_executor.outputs import Outputs
from aieng.runtime.worker_hotswap import lower_priority
from aieng.wire import messages as m
from tests.unit.demo import needs_demo_models
from tests.unit.demo import spec as demo_spec


def wait_finished(lanes: Lanes, n: int, limit_s: float = 10.0) -> list[Job]:
    done: list[Job] = []
    end = time.monotonic() + limit_s
    while len(done) < n:
        assert time.monotonic() < end, f"{len(done)} of {n} jobs finished within {limit_s}s"
        select.select([lanes.wake_fd], [], [], 0.1)
        done += lanes.finished()
    return done


def probe(seen: dict, name: str):
    def fn() -> str:
        tid = threading.get_native_id()
        seen[name] = (threading.current_thread().name, os.sched_getscheduler(tid))
        return name
    return fn


def test_a_background_job_runs_on_the_lowered_lane_and_a_serving_job_does_not():
    lanes = Lanes(1, lower=lambda: lower_priority(idle=True))
    try:
        seen: dict = {}
        lanes.submit(Job(probe(seen, "bg"), "bg", background=True))
        assert (lanes.bg_free(), lanes.free()) == (False, 1)  # the serving lane is untouched
        lanes.submit(Job(probe(seen, "fg"), "fg"))
        assert lanes.free() == 0
        done = wait_finished(lanes, 2)
        assert sorted(job.result for job in done) == ["bg", "fg"]
        assert seen["bg"] == ("lane-bg", os.SCHED_IDLE)
        assert seen["fg"] == ("lane-0", os.SCHED_OTHER)
        assert (lanes.bg_free(), lanes.free()) == (True, 1)
    finally:
        lanes.close()


def batching_executor(model: str = "tabular"):
    """An executor with only its batching parts (no sockets, no rings) serving ``model``: (it, its spec)."""
    ex = Executor.__new__(Executor)
    ex.cfg, ex.log = Config(device="cpu", intra_op_threads=1), logging.getLogger("t")
    ex.failed = {}
    ex.inline = InlinePost(ex.cfg.inline_postprocess_us)
    ex.inline_pre = InlinePre(0, ex.cfg.max_message_bytes)
    ex.builder = SessionBuilder(ex.cfg, ex.log, ex.inline, ex.inline_pre)
    spec = demo_spec(model)
    ex.sessions = {spec.key: ex.builder.build(spec, wide=False)}
    ex.outputs = Outputs(ex.cfg, None, None, ex.inline, None, None, None, ex.log)  # knows post-0
    ex.init_batcher()
    return ex, spec


@needs_demo_models
def test_the_executor_queues_background_tasks_apart_and_runs_them_on_the_background_lane():
    ex, spec = batching_executor()
    sess = ex.sessions[spec.key]
    tensors = [[i.name, i.dtype.name, [1 if not isinstance(d, int) or d < 0 else d for d in i.dims], 0]
               for i in sess.inputs]

    def task(rid: int, background: bool) -> m.InferTask:
        return m.InferTask(rid, "tabular", "1", time.monotonic() + 5, m.Ref("seg", rid, 0, tensors), 0, 0,
                           "post-0", {}, background=background)

    ex.accept(task(1, False))
    ex.accept(task(2, True))
    assert [p.rid for p in ex.batcher.queues[spec.key].items] == [1]
    assert [p.rid for p in ex.bg_batcher.queues[spec.key].items] == [2]

    ex.assemble = lambda sess, batch: ({}, [{}] * len(batch), batch)  # no rings here: nothing to copy
    ex.versions = SimpleNamespace(poll=lambda: None)
    ex.direct, ex.poller, ex.ready = SimpleNamespace(poll=lambda poller, ready: None), None, {}  # no frontend
    ex.lanes = OneFreeLaneEach()
    ex.after_drain(time.monotonic() + 1.0)  # both batches are due
    assert ex.lanes.submitted == [([1], False), ([2], True)]
    assert (ex.batcher.pending(), ex.bg_batcher.pending()) == (0, 0)


class OneFreeLaneEach:
    """Lanes that record what they are given: one serving lane and the background lane, both free."""

    def __init__(self):
        self.busy, self.submitted = 0, []
        self.n, self.running = 1, {}

    def finished(self) -> list:
        return []

    def free(self) -> int:
        return 1 - sum(1 for _, bg in self.submitted if not bg)

    def bg_free(self) -> bool:
        return not any(bg for _, bg in self.submitted)

    def spare_free(self) -> bool:
        return False  # no spare lane (tests/unit/test_spare_lane.py has one)

    def submit(self, job: Job) -> None:
        self.submitted.append(([p.rid for p in job.context[3]], job.background))
