"""Deliberately slow postprocess ops, for tests/e2e/test_rule_chain.py only.

Never part of the server: they are declared (``models/postprocess.declare``) and registered in a server's
processes only by a test that starts it with a ``sitecustomize`` importing this module (``PYTHONPATH`` set
by the test), so a model.yaml can name them.  How slow a request makes them is its own ``params`` (a
test-only op, so a client steering it harms nothing).

- ``test_spin``: a pure-Python busy loop for ``params.spin_s`` seconds (stopped by the guard's
  SIGALRM when it runs past its step's limit).
- ``test_blur``: one long OpenCV call (a Gaussian blur of 2000 x 2000 with sigma
  ``params.blur_sigma``, seconds at 60) that releases the GIL (abandoned on its helper thread).
Both copy their ``source`` to their ``output`` when they finish.
"""
from __future__ import annotations

import time

import numpy as np

from aieng.models.postprocess import declare
from aieng.models.postprocess_schema import OpDecl, Param
from aieng.processing.post.op import Op, register

PARAMS = (Param("source", "str"), Param("output", "str"))
declare(OpDecl("test_spin", PARAMS))
declare(OpDecl("test_blur", PARAMS, runs_c=True))


class _Slow(Op):
    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        self.inputs, self.outputs = [cfg["source"]], [cfg["output"]]


@register
class Spin(_Slow):
    """Busy pure-Python loop for params.spin_s seconds, then source -> output."""
    NAME = "test_spin"

    def __call__(self, state, params, degraded=0):
        end = time.monotonic() + float(params.get("spin_s", 0))
        n = 0
        while time.monotonic() < end:
            n += 1
        return {self.cfg["output"]: np.array(state[self.cfg["source"]])}


@register
class Blur(_Slow):
    """One OpenCV Gaussian blur with sigma params.blur_sigma (0: none), then source -> output."""
    NAME = "test_blur"

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        import cv2  # noqa: F401  at build: importing it inside a request would count against its limit

    def __call__(self, state, params, degraded=0):
        import cv2

        sigma = float(params.get("blur_sigma", 0))
        if sigma > 0:
            cv2.GaussianBlur(np.ones((2000, 2000), np.float32), (0, 0), sigma)
        return {self.cfg["output"]: np.array(state[self.cfg["source"]])}
