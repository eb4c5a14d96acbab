"""One request's answer from its model's chain, as the message the frontend gets.

The postprocess worker and the executor (for a chain it runs itself, ``gpu_executor/inline_post``)
both build it here.  ``answer(chain, task, views, log)`` runs the chain on the request's output views,
packs the values (``to_wire``: arrays as tensor maps, numpy scalars as plain ones) and stamps the
trail's ``post_started``/``post_us``.  It returns the ``Result``, or the ``Failed`` the request gets:
TIMEOUT with the step timings for a step past its ``fail`` limit, the request's own ``RequestError``
(user code's, ``python_op``: INVALID_INPUT from a ValueError, INTERNAL "Type: message" with its
traceback logged with the trace id), INTERNAL for anything else (logged).  ``task``: a ``PostTask``, a
``PostBatch``'s ``PostItem`` or an ``InferTask`` (what it reads: rid, params, degraded, geometry, request,
trace, trail, features).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from aieng.processing import usercode
from aieng.processing.post.chain import Chain, StepTimedOut
from aieng.wire import messages as m
from aieng.wire.protocol import INTERNAL, RequestError, encode_tensor, pack


def to_wire(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return encode_tensor(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def answer(chain: Chain, task: Any, views: dict[str, Any], log) -> m.Result | m.Failed:
    started = time.monotonic()
    t0 = time.perf_counter_ns()
    try:
        outcome = chain.run(views, task.params, task.degraded, task.geometry, task.request)
        packed = pack({k: to_wire(v) for k, v in outcome.values.items()})
    except StepTimedOut as exc:
        log.warning("%s: %s", chain.key, exc.message, extra={"trace": task.trace})
        return m.Failed(task.rid, exc.code, exc.message, None, exc.steps)
    except RequestError as exc:
        usercode.log_failure(log, exc, task.rid, task.trace)  # user code's own exception: its traceback
        return m.Failed(task.rid, exc.code, exc.message)
    except Exception as exc:
        log.exception("postprocess failed for rid %s", task.rid)
        return m.Failed(task.rid, INTERNAL, f"postprocessing failed: {type(exc).__name__}")
    task.trail.post_started, task.trail.post_us = started, (time.perf_counter_ns() - t0) // 1000
    return m.Result(task.rid, packed, task.trail, outcome.confidence, outcome.steps, task.features,
                    outcome.distance)
