"""A request's stages as span intervals, from the clock readings it already carries; pure (no SDK).

``answered``: the stamps of the frontend (received, dispatched, answer in, answer sent) and of the
``Trail`` (every clock is CLOCK_MONOTONIC, one clock for every process) make one chain of points;
each point is clamped between the one before it and the answer's sending, so the stages are ordered,
never overlap and lie within the request.  The stages are ``timing_us``'s, and ``postprocess`` has one
child per postprocess step (in the order they ran).  ``failed``: what the frontend knows of a request
that ended in an error: its wait in the frontend and the stage it had reached.  ``page``: a pipeline
page (``ocr``): its steps, one after another, from the page's ``timing_us``.  Names and attributes:
docs/metrics.md, "Tracing".
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

from aieng.wire.records import Step, Trail

SERVER = -1  # a stage's parent: the request's own (server) span
CHAIN = ("frontend_in", "preprocess_queue", "preprocess", "handoff", "batch_wait", "inference",
         "hop.to_postprocess", "postprocess", "hop.to_frontend", "frontend_out")
PAGE_STEPS = ("textdet", "textrec", "join")


class Stage(NamedTuple):
    name: str
    start: float  # monotonic seconds
    end: float
    attrs: dict
    parent: int = SERVER  # index of the parent stage in the list, or SERVER


def _clamped(points: Iterable[float], lo: float, hi: float) -> list[float]:
    out, prev = [], lo
    for t in points:
        prev = min(max(t, prev), hi)
        out.append(prev)
    return out


def answered(received: float, dispatched: float, t: Trail, steps: Iterable[Step], answered_at: float,
             sent: float) -> list[Stage]:
    """The stages of a request the model answered (``answered_at``: its result reached the frontend)."""
    batch_end = t.batch_started + t.infer_us / 1e6
    post_end = t.post_started + t.post_us / 1e6
    points = _clamped((received, dispatched, t.pre_started, t.pre_sent, t.exec_arrived, t.batch_started,
                       batch_end, t.post_started, post_end, answered_at, sent), received, sent)
    stages = [Stage(name, a, b, {}) for name, a, b in zip(CHAIN, points, points[1:])]
    run = CHAIN.index("inference")
    stages[run] = stages[run]._replace(attrs={"aieng.batch_size": t.batch, "aieng.padded_len": t.padded,
                                              "aieng.seq_len": t.seq_len})
    post = CHAIN.index("postprocess")
    lo, hi = stages[post].start, stages[post].end
    at = lo
    for name, us, outcome in steps:
        end = min(at + us / 1e6, hi)
        stages.append(Stage(f"postprocess.{name}", at, end, {"aieng.outcome": outcome}, post))
        at = end
    return stages


def failed(received: float, dispatched: float, stage: str, end: float) -> list[Stage]:
    """The stages of a request answered with an error while it was in ``stage`` (its holder's role;
    ``dispatched`` 0: it never left the frontend)."""
    if dispatched <= 0.0:
        return [Stage("frontend_in", received, end, {})]
    at = min(max(dispatched, received), end)
    return [Stage("frontend_in", received, at, {}), Stage(stage, at, end, {"aieng.reached": True})]


def page(received: float, timing: dict[str, int], extra: dict, end: float) -> list[Stage]:
    """The steps of a pipeline page, one after another from ``received`` (``timing``: microseconds)."""
    stages, at = [], received
    for name in PAGE_STEPS:
        if name not in timing:
            continue
        stop = min(at + timing[name] / 1e6, end)
        attrs: dict = {}
        if name == "textrec":  # the fan-out: one crop request per box, their preprocessing summed
            attrs = {"aieng.crops": int(extra.get("crops", 0)), "aieng.crop_us": int(timing.get("crop", 0)),
                     "aieng.crop_batch_mean": float(extra.get("crop_batch_mean", 0.0))}
        stages.append(Stage(name, at, stop, attrs))
        at = stop
    return stages
