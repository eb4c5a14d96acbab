"""A model's postprocessing as an ordered chain of steps, each with its own time limit.

``model.yaml``'s ``postprocess`` gives either ``steps`` (and an optional ``answer`` list), the list of
steps itself, or, as before, one op (a one-step chain named after its op).  Step keys: ``op``,
``name``, ``timeout_ms``, ``on_timeout`` (``fail`` or ``skip``), ``isolate`` (see ``guard``), and the
op's own parameters (docs/models.md, 'Postprocess chains').  ``parse`` (``models/postprocess``) checks all
of it against the ops' declarations when a spec is loaded and its ValueError names the step, so a bad chain
fails the model's load; ``Chain`` builds each step from that result, its op's implementation looked up by
name once, here (``op.REGISTRY``), never per request.

A run starts from the model's outputs.  A step whose inputs are missing because an earlier step was
skipped is skipped as well.  Each step reports ``[name, microseconds, outcome]`` with outcome ``ok``,
``skipped`` (past its limit with ``skip``, or its input was skipped) or ``timeout`` (past its limit
with ``fail``: the request gets TIMEOUT naming the step); those go into ``timing_us``.  An image
request's ``messages.Geometry`` is in the state as ``geometry`` for the ops that map boxes back to the
page (``scale_boxes``, ``db_boxes`` ``to_page``).  A ``python`` step (``python_op``: a team's own code) also
gets the request's frame (``run``'s ``request``), is always given a limit, and is told when a call was
stopped at it (``Op.abandoned``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aieng.models.postprocess import parse
from aieng.processing.post import ctc, detection, ops, python_op  # noqa: F401  (they fill the registry)
from aieng.processing.post.guard import Guard
from aieng.processing.post.op import GEOMETRY, REGISTRY
from aieng.wire.protocol import TIMEOUT, RequestError
from aieng.wire.records import Step


@dataclass
class Outcome:
    """One run: the answer's values, a ``Step`` per step, and the steps skipped."""
    values: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    skipped: list = field(default_factory=list)
    confidence: float | None = None
    distance: float | None = None  # an embedding's cosine distance to the golden centroid (drift)


class StepTimedOut(RequestError):
    """A step with ``on_timeout: fail`` ran past its limit; carries the step timings so far."""

    def __init__(self, message: str, steps: list[Step]):
        super().__init__(TIMEOUT, message)
        self.steps = steps

    @classmethod
    def of(cls, step: dict, steps: list[Step]) -> "StepTimedOut":
        """``step`` (its parsed section) ran past its limit; ``steps``: the timings so far, its own last."""
        return cls(f"postprocess step '{step['name']}' (op {step['op']}) ran past its "
                   f"{step['timeout_ms']:g} ms limit", steps)


_GUARD = Guard()  # one per process: it owns SIGALRM and the helper threads


class Chain:
    """The built chain of one model version.  ``chain(outs, params, degraded)`` returns the answer's
    values (the old single-op interface); ``run`` returns the whole ``Outcome``."""

    def __init__(self, spec, guard: Guard | None = None):
        parsed = parse(spec.postprocess.section())
        self.key = spec.key  # the version, for log lines
        self.guard = guard or _GUARD
        self.answer = parsed["answer"]
        self.steps = []
        for i, s in enumerate(parsed["steps"]):
            try:
                op = REGISTRY[s["op"]](s["params"], spec)
            except Exception as exc:
                raise ValueError(f"postprocess step {i + 1} '{s['name']}' (op {s['op']}): "
                                 f"{type(exc).__name__}: {exc}") from None
            limit = op.limit_ms(s["timeout_ms"])
            self.steps.append((s if limit == s["timeout_ms"] else {**s, "timeout_ms": limit}, op))
        # what ``run`` reads of each step, worked out once: (step, op, name, limit in seconds, whether its
        # inputs are copied first (a thread step may outlive its slot), whether it takes the request, whether
        # it gives the answer's confidence, its distance)
        self.plan = [(s, op, s["name"], s["timeout_ms"] / 1000.0,
                      s["isolate"] == "thread" and s["timeout_ms"] > 0, bool(op.TAKES_REQUEST),
                      hasattr(op, "confidence"), hasattr(op, "distance"))
                     for s, op in self.steps]
        # a chain of one step whose inputs are never copied (a hook's, a one-op chain) runs as ``run_one``
        self.one = self.plan[0] if len(self.plan) == 1 and not self.plan[0][4] else None

    def __call__(self, outs: dict[str, Any], params: dict, degraded: int = 0) -> dict[str, Any]:
        return self.run(outs, params, degraded).values

    def run(self, outs: dict[str, Any], params: dict, degraded: int = 0, geometry=None,
            request: bytes | None = None) -> Outcome:
        if self.one is not None and geometry is None:
            return self.run_one(outs, params, degraded, request)
        state: dict[str, Any] = dict(outs)
        if geometry is not None:  # an image request's sizes (messages.Geometry), for the box-mapping ops
            state[GEOMETRY] = geometry
        written: list[str] = []
        missing: set[str] = set()
        out = Outcome({})
        confidence_op = distance_op = None
        for s, op, name, limit_s, copies, takes_request, confides, measures in self.plan:
            if missing.intersection(op.inputs):
                out.steps.append(Step(name, 0, "skipped"))
                out.skipped.append(name)
                missing.update(op.outputs)
                continue
            t0 = time.perf_counter_ns()
            view = state
            if copies:
                # an abandoned step may still read its inputs after the shared-memory slot is reused
                view = {**state, **{k: np.array(state[k]) for k in op.inputs if k in outs and k in state}}
            if takes_request:  # user code: the request's frame, its inputs decoded there
                call = lambda: op(view, params, degraded, request)  # noqa: E731
            else:
                call = lambda: op(view, params, degraded)  # noqa: E731
            ok, values = self.guard.call(call, limit_s, s["isolate"])
            us = (time.perf_counter_ns() - t0) // 1000
            if not ok:
                op.abandoned()
                if s["on_timeout"] == "fail":
                    out.steps.append(Step(name, us, "timeout"))
                    raise StepTimedOut.of(s, out.steps)
                out.steps.append(Step(name, us, "skipped"))
                out.skipped.append(name)
                missing.update(op.outputs)
                continue
            out.steps.append(Step(name, us, "ok"))
            for key, value in values.items():
                state[key] = value
                missing.discard(key)
                if key not in written:
                    written.append(key)
            if confides:
                confidence_op = (op, values)
            if measures:
                distance_op = (op, values)
        keys = self.answer if self.answer is not None else written
        out.values = {k: state[k] for k in keys if k in state and k not in missing}
        if confidence_op is not None:
            out.confidence = confidence_op[0].confidence(confidence_op[1])
        if distance_op is not None:
            out.distance = distance_op[0].distance(distance_op[1])
        return out

    def run_one(self, outs: dict[str, Any], params: dict, degraded: int, request: bytes | None) -> Outcome:
        """``run`` for a chain of one step (``one``), without the bookkeeping of skipped steps: the same
        outcome, a few microseconds less a request (the postprocess worker's per-row cost, issue 36)."""
        s, op, name, limit_s, _, takes_request, confides, measures = self.one
        t0 = time.perf_counter_ns()
        if takes_request:
            ok, values = self.guard.call(lambda: op(outs, params, degraded, request), limit_s, s["isolate"])
        else:
            ok, values = self.guard.call(lambda: op(outs, params, degraded), limit_s, s["isolate"])
        us = (time.perf_counter_ns() - t0) // 1000
        if not ok:
            op.abandoned()
            if s["on_timeout"] == "fail":
                raise StepTimedOut.of(s, [Step(name, us, "timeout")])
            kept = {k: outs[k] for k in self.answer or () if k in outs and k not in op.outputs}
            return Outcome(kept, [Step(name, us, "skipped")], [name])
        if self.answer is None:
            out = Outcome(dict(values), [Step(name, us, "ok")])
        else:
            out = Outcome({k: values[k] if k in values else outs[k] for k in self.answer
                           if k in values or k in outs}, [Step(name, us, "ok")])
        if confides:
            out.confidence = op.confidence(values)
        if measures:
            out.distance = op.distance(values)
        return out
