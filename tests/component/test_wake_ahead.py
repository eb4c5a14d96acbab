"""Wake-ahead (``messages.Soon``) on a lone request's way, with the real workers of a hook model (the penguins
example: its ``pre`` and ``post`` are user code) built in this process over real lanes and rings, each driven
by hand: the preprocess worker tells the executor that a lone request comes once that model's lone requests
are known to take it at most ``SOON_WORK_S``; the executor, told, tells the postprocess worker in turn when
the request's run will be quick and start at once; a worker told polls without sleeping until the message
comes (``came``), at most ``SPIN_MAX_S``.  A request sent under load (``alone`` False) is announced nowhere.
The same chain shows the preprocess worker's notice to the frontend carrying each slot's place, not its
tensors.
"""
from __future__ import annotations

import logging
import os
import time

import msgpack
import pytest
import zmq

from aieng.config import Config
from aieng.gpu_executor.executor import Executor
from aieng.models.repo import load_spec
from aieng.postprocess_workers.worker import PostprocessWorker
from aieng.preprocess_workers.worker import PreprocessWorker
from aieng.runtime.hub import dispatch
from aieng.runtime.specbook import SpecBook, pack
from aieng.runtime.worker import SOON_WORK_S, SPIN_MAX_S
from aieng.wire import lanes
from aieng.wire import messages as m
from tests.e2e.test_examples import build_examples
from tests.unit.demo import needs_demo_models

pytestmark = needs_demo_models
log = logging.getLogger("test")
KEY = "penguins:1"
ROW = {"bill_length_mm": 39.1, "bill_depth_mm": 18.7, "flipper_length_mm": 181, "body_mass_g": 3750,
       "island": "Torgersen", "sex": "male"}
SLOW = '''

class SlowPre(Pre):
    """The example's ``pre``, 3 ms slower: past ``SOON_WORK_S``."""

    def pre(self, inputs):
        import time
        time.sleep(0.003)
        return super().pre(inputs)
'''


class Chain:
    """A preprocess worker, the executor and a postprocess worker of one instance, and a poller per lane."""

    def __init__(self, root, entry: str = "model.py:Pre"):
        version = build_examples(root / "examples") / "penguins" / "1"
        if entry != "model.py:Pre":
            with open(version / "model.py", "a", encoding="utf-8") as fh:
                fh.write(SLOW)
            yaml = (version / "model.yaml").read_text().replace('entry: "model.py:Pre"', f'entry: "{entry}"')
            (version / "model.yaml").write_text(yaml)
        spec = load_spec("penguins", "1", str(version), allow_code=True)
        assert spec.preprocess.entry == entry
        cfg = Config(runtime_dir=str(root), postprocess_workers=1)
        self.ex = Executor(cfg, {KEY: spec}, "executor", log)
        self.post = PostprocessWorker(cfg, SpecBook({KEY: pack(spec)}), "post-0", log)
        self.pre = PreprocessWorker(cfg, SpecBook({KEY: pack(spec)}), "pre-0", log)
        for w in (self.ex, self.post, self.pre):
            w.refresh_hello()  # as its loop does first: the heartbeats between requests send it
        self.answers: list = []
        self.post.send_data = lambda data: self.answers.append(m.decode(data))
        self.notices: list = []  # what the preprocess worker tells the frontend
        self.pre.send_data = lambda data: self.notices.append(m.decode(data))
        self.pollers = {w: zmq.Poller() for w in (self.ex, self.post)}
        self.rid = 0

    def close(self) -> None:
        for w in (self.pre, self.ex, self.post):
            w.close()

    def to_pre(self, alone: bool) -> int:
        """One request of the model handed to the preprocess worker as its loop would; its rid."""
        self.rid += 1
        task = m.PreTask(self.rid, "penguins", "1", time.monotonic() + 5, post="post-0", alone=alone)
        self.pre.on_task(task, [None, lanes.Frame(memoryview(msgpack.packb({"inputs": ROW})))])
        self.pre.after_drain(time.monotonic())
        return self.rid

    def arrived(self, worker) -> list:
        """The messages waiting on ``worker``'s lane, in order."""
        return [m.decode(head) for _, head, _ in worker.pool_lanes.poll(self.pollers[worker])]

    def run(self, tasks: list) -> list:
        """The executor takes ``tasks`` as its loop would and runs them (a lane's run waited for, bounded);
        what reached the postprocess worker's lane."""
        for task in tasks:
            dispatch(m.encode(task), self.ex.handlers, log, "a lane", [])
        self.ex.after_drain(time.monotonic())
        got, deadline = self.arrived(self.post), time.monotonic() + 10
        while not any(isinstance(x, (m.PostBatch, m.Bundle, m.PostTask)) for x in got):
            assert time.monotonic() < deadline, "the executor never delivered the batch"
            time.sleep(0.001)
            self.ex.after_drain(time.monotonic())
            got += self.arrived(self.post)
        return got

    def warm(self) -> None:
        """Requests under load until the executor has measured the model's run as quick (bounded)."""
        for _ in range(200):
            if self.ex.quick(KEY):
                return
            self.to_pre(alone=False)
            self.post_all(self.run(self.arrived(self.ex)))
        assert self.ex.quick(KEY), "the executor never measured a quick run of the model"

    def post_all(self, messages: list) -> None:
        for msg in messages:
            dispatch(m.encode(msg), self.post.handlers, log, "a lane", [])
        self.post.flush()


@pytest.fixture
def chain(tmp_path):
    c = Chain(tmp_path)
    yield c
    c.close()


def test_a_lone_request_is_announced_at_each_hop_once_its_steps_are_known_to_be_quick(chain):
    chain.warm()
    chain.to_pre(alone=True)  # the worker has not timed a lone request of the model yet
    assert [type(x) for x in chain.arrived(chain.ex)] == [m.InferTask]
    for _ in range(50):  # until one is timed quick here (a loaded machine may stretch one past the limit)
        if chain.pre.alone_s[KEY] < SOON_WORK_S:
            break
        chain.to_pre(alone=True)
        chain.arrived(chain.ex)
    assert chain.pre.alone_s[KEY] < SOON_WORK_S
    second = chain.to_pre(alone=True)
    soon, task = chain.arrived(chain.ex)
    assert (type(soon), type(task), task.rid) == (m.Soon, m.InferTask, second)
    assert (soon.for_s, soon.key, soon.post) == (SPIN_MAX_S, KEY, "post-0")

    told = time.monotonic()  # (a moment before: the check holds however long the machine pauses us)
    dispatch(m.encode(soon), chain.ex.handlers, log, "a lane", [])
    assert chain.ex.wait_ms(told, 200) == 0  # polling, not sleeping
    got = chain.run([task])
    assert chain.ex.spin_until == 0.0  # its task came
    assert [type(x) for x in got] == [m.Soon, m.PostBatch]
    assert [it.rid for it in got[1].items] == [second]

    told = time.monotonic()
    dispatch(m.encode(got[0]), chain.post.handlers, log, "a lane", [])
    assert chain.post.wait_ms(told, 200) == 0
    chain.post_all(got[1:])
    assert chain.post.spin_until == 0.0
    assert [(type(a), a.rid) for a in chain.answers][-1] == (m.Result, second)


def test_a_request_sent_under_load_is_announced_nowhere(chain):
    chain.warm()
    chain.to_pre(alone=True)  # timed: the next lone one would be announced
    chain.post_all(chain.run(chain.arrived(chain.ex)))
    rid = chain.to_pre(alone=False)
    got = chain.arrived(chain.ex)
    assert [(type(x), x.rid) for x in got] == [(m.InferTask, rid)]
    assert [type(x) for x in chain.run(got)] == [m.PostBatch]


def test_an_executor_with_a_batch_waiting_does_not_announce_on(chain):
    chain.warm()
    chain.to_pre(alone=False)
    waiting, = chain.arrived(chain.ex)
    dispatch(m.encode(waiting), chain.ex.handlers, log, "a lane", [])  # queued, its batch not started
    dispatch(m.encode(m.Soon(SPIN_MAX_S, KEY, "post-0")), chain.ex.handlers, log, "a lane", [])
    assert chain.arrived(chain.post) == []
    assert [type(x) for x in chain.run([])] == [m.PostBatch]  # the waiting one's answer, unannounced


def test_the_preprocess_workers_notice_carries_each_slots_place_not_its_tensors(chain):
    rid = chain.to_pre(alone=False)
    task, = chain.arrived(chain.ex)
    notice = chain.notices[-1]  # the frontend only frees the slot: the tensors' descriptions stay off it
    assert (type(notice), notice.rids, notice.refs) == (m.Preprocessed, [rid], [task.ref.place()])
    assert task.ref.tensors != []


def test_a_slow_lone_preprocessing_is_not_announced(tmp_path):
    chain = Chain(tmp_path, entry="model.py:SlowPre")
    try:
        ids = [chain.to_pre(alone=True) for _ in range(3)]
        assert [(type(x), x.rid) for x in chain.arrived(chain.ex)] == [(m.InferTask, rid) for rid in ids]
    finally:
        chain.close()


def test_nothing_is_announced_by_workers_started_with_one_cpu(tmp_path):
    """On one CPU a process polling for a message would take the CPU from the one that is to send it."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # the workers are built seeing one usable CPU
    try:
        one = Chain(tmp_path)
    finally:
        os.sched_setaffinity(0, cpus)
    try:
        assert (one.pre.wake_ahead, one.ex.wake_ahead) == (False, False)
        for _ in range(50):  # until a lone request is timed quick: the next would be announced on two CPUs
            one.to_pre(alone=True)
            one.arrived(one.ex)
            if one.pre.alone_s[KEY] < SOON_WORK_S:
                break
        assert one.pre.alone_s[KEY] < SOON_WORK_S
        rid = one.to_pre(alone=True)
        assert [(type(x), x.rid) for x in one.arrived(one.ex)] == [(m.InferTask, rid)]
    finally:
        one.close()


def test_an_announcement_holds_the_loop_awake_at_most_spin_max_s(chain):
    w = chain.post
    before = time.monotonic()
    dispatch(m.encode(m.Soon(60.0)), w.handlers, log, "a lane", [])  # a sender asking for more is bounded
    after = time.monotonic()
    assert w.wait_ms(before, 200) == 0
    assert w.spin_until <= after + SPIN_MAX_S
    assert w.wait_ms(after + SPIN_MAX_S + 0.001, 50) == 50  # past it: what the role asked for
    assert w.spin_until == 0.0
    assert w.wait_ms(before, None) == 200
