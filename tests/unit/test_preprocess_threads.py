"""A request alone in the server (``PreTask.alone``, set by the frontend's idle rule) is preprocessed with
OpenCV's threads on every core the worker may use; any other request with one thread, as under load.
Driven through the preprocess worker's own ``handle`` with the real orientation processor."""
from __future__ import annotations

import time
from types import SimpleNamespace

import msgpack
import numpy as np

from aieng.model_repo import load_spec
from aieng.preprocess_workers.image import ImagePreprocessor
from aieng.preprocess_workers.worker import PreprocessWorker
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
    w.cfg = SimpleNamespace(max_message_bytes=1 << 24)
    w.notice = m.Preprocessed([], [])
    forwarded: list[int] = []
    w.forward = lambda task, *rest: forwarded.append(task.rid)
    w.fail = lambda rid, code, message: (_ for _ in ()).throw(AssertionError(message))
    img = cv2.imencode(".jpg", np.full((300, 400, 3), 200, np.uint8))[1].tobytes()
    body = SimpleNamespace(buffer=msgpack.packb({"inputs": {"image": img}}))
    deadline = time.monotonic() + 5
    try:
        w.handle([(m.PreTask(1, "orientation", "1", deadline, alone=True), body)])
        w.handle([(m.PreTask(2, "orientation", "1", deadline), body)])
    finally:
        cv2.setNumThreads(1)
    assert (forwarded, threads_seen) == ([1, 2], [3, 1])
