"""How a request that has left the table is answered and accounted, once (``Answers``).

Every answer the frontend sends for an admitted request goes through here: one reply, and with it the
counts (``Counts``: what health and stats report), the breaker, the response cache, the metrics, the
stage stats (an error for a request in the pipeline as a failure of its version), drift, degradation,
and the ``outcome`` the auto-rollback watches.  Metrics are recorded before the reply, so a client that
reads /metrics after its answer sees it; the answer carries the request's ``traceparent``, and its spans
(``tracing``) are built after the reply.  The reply goes where the request's kind says (``send``): a
client's to its socket, a golden case's to its load (``Golden.answer``).  Shadow copies and pipeline steps
never come here (``pipeline`` sends them to ``mirror`` and ``fanout``).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from aieng.frontend.observe.drift import DriftMonitor
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.observe.stats import StageStats
from aieng.frontend.observe.tracing import Tracing
from aieng.frontend.requests.admission import Immediate
from aieng.frontend.requests.breaker import Breakers
from aieng.frontend.requests.cache import ResponseCache
from aieng.frontend.requests.degrade import Degrader
from aieng.frontend.requests.table import GOLDEN, Request
from aieng.wire import messages as m
from aieng.wire import protocol as p

log = logging.getLogger("aieng.frontend.requests.pipeline")


class Counts:
    """What health and stats report: requests admitted, answered OK, errors by code."""

    def __init__(self) -> None:
        self.requests = 0
        self.ok = 0
        self.errors: dict[str, int] = {}

    def view(self) -> dict:
        return {"requests": self.requests, "ok": self.ok, "errors": dict(self.errors)}


class Answers:
    def __init__(self, reply: Callable[[list, bytes], None], metrics: Metrics, stats: StageStats,
                 breakers: Breakers, cache: ResponseCache, drift: DriftMonitor, degrader: Degrader,
                 outcome: Callable[[str, str, str, float], None], tracing: Tracing | None = None):
        """``reply(envelope, body)`` sends to a client; ``outcome(model, version, code, seconds)`` sees every
        answer."""
        self.reply, self.metrics, self.stats, self.breakers = reply, metrics, stats, breakers
        self.cache, self.drift, self.degrader, self.outcome = cache, drift, degrader, outcome
        self.tracing = tracing if tracing is not None else Tracing()
        self.counts = Counts()

    def admitted(self) -> None:
        self.counts.requests += 1

    def ok(self, req: Request, msg: m.Result, timing: dict[str, int], now: float) -> None:
        """A model's answer (``timing``: the request's stage times, computed by the pipeline)."""
        try:  # bookkeeping; an error here must not lose the answer (the request has left the table)
            self.account(req, msg, timing, now)
        except Exception:
            log.exception("bookkeeping of an answer failed")
        extra: dict[str, Any] = {"batch": msg.trail.batch, "trace_id": req.trace, "route": req.route}
        skipped = [step[0] for step in msg.steps if step[2] == "skipped"]
        if req.degraded or skipped:  # a step skipped at its time limit: level 1, optional work left out
            extra["degraded"] = max(req.degraded, 1 if skipped else 0)
        if skipped:
            extra["skipped_steps"] = skipped
        if req.tctx is not None:
            extra["traceparent"] = req.tctx.header()
        timing = timing or {"total": int((now - req.received) * 1e6)}
        body = p.result_body(req.client_id, req.model, req.version, msg.outputs, timing, extra)
        if req.kind is GOLDEN:  # ``send``, written out: every answer passes here
            req.link.answer(body)
        else:
            self.reply(req.envelope, body)
        log.debug("answered OK in %d us", timing["total"], extra={"trace": req.trace})
        sent = time.monotonic()
        timing["frontend_out"] = int((sent - now) * 1e6)
        self.stats.add(req.model, timing, req.batch, req.seq_len, req.padded or req.seq_len)
        self.tracing.request(req, msg.trail, msg.steps, now, sent)

    def account(self, req: Request, msg: m.Result, timing: dict[str, int], now: float) -> None:
        for name, us, _ in msg.steps:  # a breakdown of "postprocess", not more stages of the total
            timing[f"postprocess.{name}"] = int(us)
        self.stats.add_steps(req.model, msg.steps)
        t = msg.trail
        req.batch, req.padded, req.seq_len = t.batch, t.padded, t.seq_len
        self.counts.ok += 1
        self.breakers.success(req.key)
        if req.cache_key is not None and all(step[2] == "ok" for step in msg.steps):  # never a partial one
            self.cache.put(req.cache_key, msg.outputs)
        self.metrics.answered(req.model, req.version, timing, req.batch, msg.confidence)
        if req.kind is not GOLDEN:  # a golden case is the server checking a load, not traffic
            self.drift.observe(req.model, req.version, msg.features, msg.confidence, msg.distance,
                               req.peer, now)
        self.degrader.observe_latency(req.key, now - req.received)
        self.outcome(req.model, req.version, "OK", now - req.received)

    def error(self, req: Request, code: str, message: str, model_fault: bool) -> None:
        """An error for an admitted request; ``model_fault``: the model run itself failed (the breaker
        counts it)."""
        if model_fault:
            self.breakers.failure(req.key, time.monotonic(), req.probe)
        else:
            self.breakers.neutral(req.key, req.probe)
        self.count_error(code, req.model, req.version)
        took = time.monotonic() - req.received
        self.stats.add_failure(req.model, req.version, int(took * 1e9))  # OIP statistics' "fail"
        self.outcome(req.model, req.version, code, took)
        log.debug("answered %s at stage %s", code, req.stage, extra={"trace": req.trace})
        self.refuse(req, code, message, counted=True)
        self.tracing.failed(req, code, message, time.monotonic())

    def refuse(self, req: Request, code: str, message: str, counted: bool = False) -> None:
        """An error for a request that never entered the pipeline (a cold load's waiter: no breaker, no
        auto-rollback outcome)."""
        if not counted:
            self.count_error(code, req.model, req.version)
        where = {"model": req.model, "version": req.version, "route": req.route}
        if req.tctx is not None:
            where["traceparent"] = req.tctx.header()
        self.send(req, p.error_body(req.client_id, code, message, req.trace, where))

    def count_error(self, code: str, model: str = "", version: str = "") -> None:
        self.counts.errors[code] = self.counts.errors.get(code, 0) + 1
        self.metrics.failed(model, version, code)

    def page(self, req: Request, outputs: bytes, timing: dict[str, int], extra: dict, now: float) -> None:
        """A pipeline page's answer (``fanout``); its steps show as the model's steps in the report."""
        self.counts.ok += 1
        self.breakers.success(req.key)
        if req.cache_key is not None:
            self.cache.put(req.cache_key, outputs)
        self.metrics.answered(req.model, req.version, timing, 1, None)
        for step, us in timing.items():  # the pipeline's steps as its stages (four names: bounded labels)
            if step != "total":
                self.metrics.stage.labels(req.model, req.version, step).observe(us / 1e6)
        self.stats.add_steps(req.model, [(k, us, "ok") for k, us in timing.items() if k != "total"])
        self.degrader.observe_latency(req.key, now - req.received)
        self.outcome(req.model, req.version, "OK", now - req.received)
        extra = {"trace_id": req.trace, "route": req.route, **extra}
        if req.tctx is not None:
            extra["traceparent"] = req.tctx.header()
        self.send(req, p.result_body(req.client_id, req.model, req.version, outputs, timing, extra))
        self.stats.add(req.model, timing, 1, 0, 0)
        self.tracing.page(req, timing, extra, time.monotonic())

    def send(self, req: Request, body: bytes) -> None:
        """An answer's one way out, by the request's kind: a golden case's to its load, never a socket."""
        if req.kind is GOLDEN:
            req.link.answer(body)
        else:
            self.reply(req.envelope, body)

    def immediate(self, envelope: list, req_id: Any, d: Immediate, received: float) -> None:
        """An answer admission found without the pipeline (a cache hit, a degradation fallback)."""
        us = int((time.monotonic() - received) * 1e6)
        self.metrics.requests.labels(d.model, d.version, "OK").inc()
        if d.extra.get("cached"):
            self.metrics.cache_hits.labels(d.model).inc()
        self.counts.ok += 1
        timing = {"frontend_in": us, "total": us}
        extra = d.extra if d.tctx is None else {**d.extra, "traceparent": d.tctx.header()}
        self.reply(envelope, p.result_body(req_id, d.model, d.version, d.outputs, timing, extra))
        self.tracing.immediate(d.tctx, d.model, d.version, d.extra.get("route", ""), received,
                               time.monotonic())
