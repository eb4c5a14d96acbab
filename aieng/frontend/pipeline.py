"""Routing one request through preprocess -> executor -> postprocess, and ending it once.

The frontend loop hands every hub message to a handler here (a dispatch
table by message type).  Each stage hand-off stamps the time, moves the
request in the table to its next holder, and passes the slot on (see
``table`` for who frees which slot).  A message about a request its sender no
longer holds (answered already: timeout, worker death) is dropped, and any
slot it carried is freed.

Hold, don't refuse: when the next stage has no live worker (one restarting),
the request waits in the table for a hello from that role, bounded by its
deadline and the in-flight limit.  A send that fails (the worker vanished
before we knew) holds the request the same way: the worker never got it.
Only what a dead worker actually held is answered UNAVAILABLE.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from aieng import messages as m
from aieng import protocol as p
from aieng.frontend.breaker import Breakers
from aieng.frontend.cache import ResponseCache
from aieng.frontend.degrade import Degrader
from aieng.frontend.drift import DriftMonitor
from aieng.frontend.metrics import Metrics
from aieng.frontend.stats import StageStats
from aieng.frontend.table import EXEC, POST, PRE, Request, RequestTable
from aieng.frontend.workers import Workers

log = logging.getLogger("aieng.frontend.pipeline")


class Counts:
    """What health and stats report: requests admitted, answered OK, errors by code."""

    def __init__(self) -> None:
        self.requests = 0
        self.ok = 0
        self.errors: dict[str, int] = {}

    def view(self) -> dict:
        return {"requests": self.requests, "ok": self.ok, "errors": dict(self.errors)}


class Pipeline:
    def __init__(self, table: RequestTable, workers: Workers, send: Callable[[str, list], bool],
                 reply: Callable[[list, bytes], None], metrics: Metrics, stats: StageStats, breakers: Breakers,
                 cache: ResponseCache, drift: DriftMonitor, degrader: Degrader):
        self.table, self.workers, self.send, self.reply = table, workers, send, reply
        self.metrics, self.stats, self.breakers = metrics, stats, breakers
        self.cache, self.drift, self.degrader = cache, drift, degrader
        self.counts = Counts()
        self.handlers: dict[type, Callable[[Any, bytes], None]] = {
            m.Preprocessed: self.on_preprocessed, m.Inferred: self.on_inferred,
            m.Result: self.on_result, m.Failed: self.on_failed,
        }

    # -- sending a request to its next stage -------------------------------------
    def start(self, req: Request) -> None:
        """A newly admitted request: to a preprocess worker with the client's raw frame."""
        self.table.add(req)
        req.stamps[PRE] = time.monotonic()
        req.timing["frontend_in"] = int((req.stamps[PRE] - req.received) * 1e6)
        self.route(req, PRE)

    def route(self, req: Request, stage: str) -> None:
        now = time.monotonic()
        worker = self.workers.pick(stage, now, self.table.load)
        if worker is None:
            self.table.hold(req, stage)
            return
        self.table.move(req, stage, worker)
        if stage == PRE:
            frames = [m.encode(m.PreTask(req.rid, req.model, req.version, req.deadline, req.trace)), req.body]
        elif stage == EXEC:
            upstream = 0 if req.degraded >= 2 else self.table.count_stage(req.key, PRE)  # level 2: no waiting
            frames = [m.encode(m.InferTask(req.rid, req.model, req.version, req.deadline, req.ref, req.seq_len,
                                           upstream, req.trace))]
        else:
            frames = [m.encode(m.PostTask(req.rid, req.model, req.version, req.ref, req.params, req.degraded,
                                          req.trace))]
        if not self.send(worker, frames):  # not connected: it never got it, so it is safe to hold
            self.workers.gone(worker)
            self.table.hold(req, stage)
            return
        if stage == PRE:
            req.body = None
        else:
            self.table.handed(req)  # the holder frees the slot from here on

    def release_waiting(self, role: str) -> None:
        """A worker of ``role`` said hello: send it what waited for one."""
        for req in self.table.take_waiting(role):
            self.route(req, role)

    # -- hub messages ---------------------------------------------------------------
    def on_preprocessed(self, msg: m.Preprocessed, ident: bytes) -> None:
        req = self.table.held(msg.rid, ident, PRE)
        if req is None:  # answered already (timeout): the slot is ours to free
            self.table.stray(msg.ref)
            return
        now = time.monotonic()
        self.metrics.worker.labels(PRE, req.holder).inc()
        req.timing["preprocess"] = msg.pre_us
        req.timing["preprocess_queue"] = max(0, int((now - req.stamps[PRE]) * 1e6) - msg.pre_us)
        req.seq_len, req.features = msg.seq_len, msg.features
        self.table.take(req, msg.ref)
        req.stamps[EXEC] = now
        self.route(req, EXEC)

    def on_inferred(self, msg: m.Inferred, ident: bytes) -> None:
        now = time.monotonic()
        for rid, ref, wait_us in zip(msg.rids, msg.refs, msg.wait_us):
            req = self.table.held(rid, ident, EXEC)
            if req is None:
                self.table.stray(ref)
                continue
            self.metrics.worker.labels(EXEC, req.holder).inc()
            req.timing["batch_wait"] = wait_us
            req.timing["inference"] = msg.infer_us
            req.timing["handoff"] = max(0, int((now - req.stamps[EXEC]) * 1e6) - wait_us - msg.infer_us)
            req.batch, req.padded = msg.batch, msg.padded
            self.table.take(req, ref)
            req.stamps[POST] = now
            self.route(req, POST)

    def on_result(self, msg: m.Result, ident: bytes) -> None:
        if self.table.held(msg.rid, ident, POST) is None:
            return
        now = time.monotonic()
        req = self.table.finish(msg.rid)
        self.metrics.worker.labels(POST, req.holder).inc()
        req.timing["postprocess"] = msg.post_us
        req.timing["postprocess_queue"] = max(0, int((now - req.stamps[POST]) * 1e6) - msg.post_us)
        req.timing["total"] = int((now - req.received) * 1e6)
        self.counts.ok += 1
        self.breakers.success(req.key)
        if req.cache_key is not None:
            self.cache.put(req.cache_key, msg.outputs)
        self.metrics.answered(req.model, req.version, req.timing, req.batch, msg.confidence)  # before the reply
        self.drift.observe(req.model, req.version, req.features)
        extra: dict[str, Any] = {"batch": req.batch, "trace_id": req.trace}
        if req.degraded:
            extra["degraded"] = req.degraded
        self.degrader.observe_latency(req.key, now - req.received)
        self.reply(req.envelope, p.result_body(req.client_id, req.model, req.version, msg.outputs, req.timing,
                                               extra))
        log.debug("answered OK in %d us", req.timing["total"], extra={"trace": req.trace})
        req.timing["frontend_out"] = int((time.monotonic() - now) * 1e6)
        self.stats.add(req.model, req.timing, req.batch, req.seq_len, req.padded or req.seq_len)

    def on_failed(self, msg: m.Failed, ident: bytes) -> None:
        req = self.table.get(msg.rid)
        if req is None or req.holder.encode() != ident:
            self.table.stray(msg.ref)
            return
        if msg.ref is not None:
            self.table.take(req, msg.ref)
        self.metrics.worker.labels(req.stage, req.holder).inc()
        self.fail(msg.rid, msg.code, msg.message)

    def on_worker_down(self, worker: str, pid: int, exitcode: int) -> int:
        """The supervisor saw ``worker`` die: answer what it held (its slots are ours to free)."""
        self.workers.down(worker, pid)
        held = self.table.held_by(worker)
        for rid in held:
            self.fail(rid, p.UNAVAILABLE, f"{worker} exited (code {exitcode}) while holding the request",
                      holder_dead=True)
        return len(held)

    # -- ending a request with an error ---------------------------------------------
    def fail(self, rid: int, code: str, message: str, holder_dead: bool = False) -> None:
        req = self.table.finish(rid, holder_dead)
        if req is None:
            return
        if code == p.INTERNAL and req.stage == EXEC:  # the model run itself failed
            self.breakers.failure(req.key, time.monotonic(), req.probe)
        else:
            self.breakers.neutral(req.key, req.probe)
        self.count_error(code, req.model, req.version)
        log.debug("answered %s at stage %s", code, req.stage, extra={"trace": req.trace})
        self.reply(req.envelope, p.error_body(req.client_id, code, message, req.trace))

    def count_error(self, code: str, model: str = "", version: str = "") -> None:
        self.counts.errors[code] = self.counts.errors.get(code, 0) + 1
        self.metrics.failed(model, version, code)

    def sweep(self, now: float) -> None:
        for rid in self.table.expired(now):
            req = self.table.get(rid)
            where = req.stage if req.holder else f"waiting for a {req.stage} worker"
            self.fail(rid, p.TIMEOUT, f"no answer within the deadline (stage: {where})")

    def fail_all(self, code: str, message: str) -> int:
        rids = list(self.table.items)
        for rid in rids:
            self.fail(rid, code, message)
        return len(rids)
