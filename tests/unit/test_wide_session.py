"""The idle-time wide session runs a batch only while the server is idle: the executor's queue and lanes
are empty *and* every request in it was sent alone (``InferTask.alone``, the frontend's idle rule).  An
executor that waits on a busy preprocessing pool is not an idle machine: its batch goes to a lane."""
from __future__ import annotations

import time
from types import SimpleNamespace

from aieng.gpu_executor.executor import QUICK_RUN_S
from aieng.wire import messages as m
from tests.unit.demo import needs_demo_models
from tests.unit.test_background_lane import OneFreeLaneEach, batching_executor


class RecordingSession:
    """Stands in for the wide session only: records that a batch ran on it."""

    def __init__(self):
        self.runs = 0

    def run(self, feeds):
        self.runs += 1
        return []


@needs_demo_models
def test_only_a_batch_of_requests_sent_alone_runs_on_the_wide_session():
    ex, spec = batching_executor()
    wide = ex.builder.wide[spec.key] = RecordingSession()
    tensors = [[i.name, i.dtype.name, [1 if not isinstance(d, int) or d < 0 else d for d in i.dims], 0]
               for i in ex.sessions[spec.key].inputs]
    ex.assemble = lambda sess, batch: ({}, [{}] * len(batch), batch)  # no rings here: nothing to copy
    finished: list[list[int]] = []
    ex.finish_batch = lambda job: finished.append([p.rid for p in job.context[3]])
    ex.versions = SimpleNamespace(poll=lambda: None)
    ex.direct, ex.poller, ex.ready = SimpleNamespace(poll=lambda poller, ready: None), None, {}
    ex.lanes = OneFreeLaneEach()

    def task(rid: int, alone: bool) -> m.InferTask:
        return m.InferTask(rid, "tabular", "1", time.monotonic() + 5, m.Ref("seg", rid, 0, tensors), 0, 0,
                           "post-0", {}, alone=alone)

    ex.accept(task(1, alone=True))
    ex.after_drain(time.monotonic() + 1.0)
    assert (wide.runs, finished, ex.lanes.submitted) == (1, [[1]], [])  # ran here, on the wide session
    ex.accept(task(2, alone=False))  # the executor is as idle as before, the server was not
    ex.after_drain(time.monotonic() + 1.0)
    assert (wide.runs, ex.lanes.submitted) == (1, [([2], False)])


@needs_demo_models
def test_a_lone_batch_of_a_quick_model_runs_in_the_loop_and_a_slow_ones_on_a_lane():
    ex, spec = batching_executor()
    ex.builder.wide.pop(spec.key, None)  # no wide session: the serving one runs it, here or on a lane
    tensors = [[i.name, i.dtype.name, [1 if not isinstance(d, int) or d < 0 else d for d in i.dims], 0]
               for i in ex.sessions[spec.key].inputs]
    ex.assemble = lambda sess, batch: ({}, [{}] * len(batch), batch)
    finished: list[list[int]] = []
    ex.finish_batch = lambda job: finished.append([p.rid for p in job.context[3]])
    ex.versions = SimpleNamespace(poll=lambda: None)
    ex.direct, ex.poller, ex.ready = SimpleNamespace(poll=lambda poller, ready: None), None, {}
    ex.lanes = OneFreeLaneEach()

    def lone(rid: int) -> m.InferTask:
        return m.InferTask(rid, "tabular", "1", time.monotonic() + 5, m.Ref("seg", rid, 0, tensors), 0, 0,
                           "post-0", {}, alone=True)

    ex.batcher.queues[spec.key].run_s = None  # no run measured yet: a lane (its time is unknown)
    ex.accept(lone(1))
    ex.after_drain(time.monotonic() + 1.0)
    assert (finished, ex.lanes.submitted) == ([], [([1], False)])
    ex.batcher.observe(spec.key, 1, 0, QUICK_RUN_S / 10)  # a run well under the limit
    ex.lanes = OneFreeLaneEach()
    ex.accept(lone(2))
    ex.after_drain(time.monotonic() + 1.0)
    assert (finished, ex.lanes.submitted) == ([[2]], [])  # ran here, in the loop
    for _ in range(40):  # now its runs take ten times the limit
        ex.batcher.observe(spec.key, 1, 0, QUICK_RUN_S * 10)
    ex.accept(lone(3))
    ex.after_drain(time.monotonic() + 1.0)
    assert (finished, ex.lanes.submitted) == ([[2]], [([3], False)])
