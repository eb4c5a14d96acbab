"""A request alone in the server (``PreTask.alone``, set by the frontend's idle rule) is preprocessed with
OpenCV's threads on every core the worker may use; any other request with one thread, as under load.
Driven through the preprocess worker's own ``handle`` with the real orientation processor."""
from __future__ import annotations

import time
from types import SimpleNamespace

import msgpack
import numpy as np

from aieng.models.repo import load_spec
from aieng.preprocess_workers.worker import PreprocessWorker
from aieng.processing.pre.image import ImagePreprocessor
from aieng.wire import messages as m
from tests.unit.demo import MODELS, needs_demo_models

pytestmark = needs_demo_models

import cv2  # noqa: E402  (after aieng's image module has set OpenCV's pixel guard)


def test_a_lone_image_request_gets_every_core_and_the_next_one_thread():
    spec = load_spec("orientation", "1", str(MODELS / "orientation" / "1"))
    proc = ImagePreprocessor(spec)
    threads_seen: list[int] = []
    real = proc.process
    proc.process = lambda inputs: (threads_seen.append(cv2.getNumThreads()), real(inputs))[1]
    w = PreprocessWorker.__new__(PreprocessWorker)  # only what handle() needs: no sockets, no rings
    w.specs, w.procs, w.failed, w.cores = {spec.key: spec}, {spec.key: proc}, {}, 3
    w.frames = {}  # request frames kept within a drain (a user postprocess hook's inputs)
    w.cfg = SimpleNamespace(max_message_bytes=1 << 24)
    w.notice = m.Preprocessed([], [])
    forwarded: list[int] = []
    w.forward = lambda task, *rest: forwarded.append(task.rid)
    w.fail = lambda rid, code, message: (_ for _ in ()).throw(AssertionError(message))
    w.heartbeat = lambda: None  # no hub here (a worker heartbeats between requests)
    img = cv2.imencode(".jpg", np.full((300, 400, 3), 200, np.uint8))[1].tobytes()
    body = SimpleNamespace(buffer=msgpack.packb({"inputs": {"image": img}}))
    deadline = time.monotonic() + 5
    try:
        w.handle([(m.PreTask(1, "orientation", "1", deadline, alone=True), body)])
        w.handle([(m.PreTask(2, "orientation", "1", deadline), body)])
    finally:
        cv2.setNumThreads(1)
    assert (forwarded, threads_seen) == ([1, 2], [3, 1])


def test_a_drain_of_images_sends_each_on_when_ready_with_its_own_start():
    """Two images drained together: the first goes to the executor before the second is decoded, and each
    trail starts when its own preprocessing did (the wait behind the first is the second's queue)."""
    spec = load_spec("orientation", "1", str(MODELS / "orientation" / "1"))
    proc = ImagePreprocessor(spec)
    events: list[tuple[str, int, float]] = []
    real = proc.process
    seen = iter((1, 2))

    def process(inputs):
        events.append(("process", next(seen), time.monotonic()))
        return real(inputs)

    proc.process = process
    w = PreprocessWorker.__new__(PreprocessWorker)
    w.specs, w.procs, w.failed, w.cores = {spec.key: spec}, {spec.key: proc}, {}, 1
    w.frames = {}  # request frames kept within a drain (a user postprocess hook's inputs)
    w.cfg = SimpleNamespace(max_message_bytes=1 << 24)
    w.notice = m.Preprocessed([], [])
    sent: list[float] = []

    def forward(task, params, tensors, seq_len, info, started, geometry=None):
        events.append(("forward", task.rid, started))
        sent.append(time.monotonic())

    w.forward = forward
    w.fail = lambda rid, code, message: (_ for _ in ()).throw(AssertionError(message))
    w.heartbeat = lambda: None  # no hub here (a worker heartbeats between requests)
    img = cv2.imencode(".jpg", np.full((300, 400, 3), 90, np.uint8))[1].tobytes()
    body = SimpleNamespace(buffer=msgpack.packb({"inputs": {"image": img}}))
    deadline = time.monotonic() + 5
    w.handle([(m.PreTask(rid, "orientation", "1", deadline), body) for rid in (1, 2)])
    assert [(kind, rid) for kind, rid, _ in events] == [("process", 1), ("forward", 1), ("process", 2),
                                                          ("forward", 2)]
    started = {rid: at for kind, rid, at in events if kind == "forward"}
    assert started[1] <= events[0][2]  # its own start: just before its own processing
    assert started[2] >= sent[0]  # the second's starts after the first was sent on, not with the drain
