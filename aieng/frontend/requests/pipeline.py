"""Routing one request through preprocess -> executor -> postprocess, and ending it once.

The frontend sends each admitted request to a preprocess worker with its route; the workers tell it of
each hand-off, and the request moves in the table to its new holder.  It is answered exactly once: the
``Result``, a ``Failed``, TIMEOUT at its deadline, or UNAVAILABLE when its holder dies.  Notices may arrive
in any order: a request only moves forward.  With no live preprocess worker a request is held (bounded by
its deadline and the in-flight limit), never refused.  A request's end goes where its kind says
(``table.Kind``): a client's or a golden case's to ``answers``, a shadow copy's to ``mirror``, a pipeline
step's to ``fanout``; a small request of a version the executor does whole (an image small by its header's
pixels) goes straight to it while the server is idle, or at any load when the executor says so (``direct``);
an executor that dies holding such an image, or takes longer than ``direct_image_budget_s`` to decode one,
turns the image route off.  Preprocess workers are picked by ``Workers.pick_pre`` (a stalled worker gets no
other work); while every one is stalled, a small text, tabular or tensor request the executor can preprocess
goes to it at any load.  A request held at PRE by a preprocess worker that dies (a crash, or replaced as
stuck: ``mark_stuck``) gets one second try, alone on a worker (``retries``); one that has had it fails
UNAVAILABLE with the worker's message (the budget named for a stuck one).  docs/architecture.md ("The
request path in the frontend") has the rules in full.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol

from aieng.frontend.control.workers import IDLE, Workers
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.observe.stats import StageStats, stage_times
from aieng.frontend.requests.answers import Answers
from aieng.frontend.requests.retries import Retries
from aieng.frontend.requests.table import EXEC, GOLDEN, POST, PRE, SHADOW, STEP, Request, RequestTable
from aieng.wire import messages as m
from aieng.wire import protocol as p

log = logging.getLogger("aieng.frontend.requests.pipeline")
# The idle route needs the server idle for this long: under load a batch's answers leave the table empty for a
# moment, and a request sent straight to the executor then splits the next batch (measured: tabular at
# concurrency 64 lost about a fifth of its throughput without this).
DIRECT_QUIET_S = 0.1
# An image on the direct route has at most this many bytes per pixel its header declares (plus a little): an
# uncompressed RGBA image's size.  More would be extra chunks or scans whose decoding the pixels do not bound.
IMAGE_BYTES_PER_PIXEL = 4
IMAGE_BYTES_SLACK = 65536


class Shadows(Protocol):
    """What the pipeline tells ``mirror.Mirror``: where a primary and a shadow copy ended."""

    def primary_end(self, req: Request, outputs: bytes | None, now: float) -> None: ...

    def shadow_end(self, req: Request, outputs: bytes | None, code: str, now: float) -> None: ...


class Pages(Protocol):
    """What the pipeline asks of ``fanout.Fanout``: pipeline models' pages and their step requests."""

    def owns(self, req: Request) -> bool: ...

    def start(self, req: Request) -> None: ...

    def step_of(self, rid: int) -> str: ...

    def child_end(self, child: Request, outputs: bytes | None, code: str, message: str,
                  trail: m.Trail | None = None) -> None: ...

    def page_failed(self, rid: int, code: str) -> None: ...


class Pipeline:
    def __init__(self, table: RequestTable, workers: Workers, post_names: list[str],
                 send: Callable[[str, list], bool], answers: Answers, metrics: Metrics, stats: StageStats,
                 mirror: Shadows, fanout: Pages, direct_bytes: int = 0,
                 send_direct: Callable[[list], bool] | None = None, direct_pixels: int = 0,
                 direct_image_budget_s: float = 0.2, pre_budget_ms: float = 5000.0):
        """``send(worker, frames)`` over the hub; ``answers`` ends every admitted request once; ``mirror``
        gets both ends of shadow pairs, ``fanout`` runs pipeline models' pages."""
        self.table, self.workers, self.send, self.answers = table, workers, send, answers
        self.mirror, self.fanout = mirror, fanout
        self.direct_bytes = direct_bytes  # AIENG_INLINE_PREPROCESS_BYTES (0: never straight to the executor)
        self.direct_pixels = direct_pixels  # AIENG_INLINE_IMAGE_PIXELS, likewise for an image
        self.images_off = ""  # why images no longer take the direct route ("": they may)
        self.direct_image_budget_s = direct_image_budget_s  # AIENG_INLINE_IMAGE_BUDGET_MS, in seconds
        self.pre_budget_ms = pre_budget_ms  # AIENG_PREPROCESS_BUDGET_MS, named when a stuck worker goes
        self.stuck: set[str] = set()  # preprocess workers reported stuck to the supervisor, not yet down
        self.retries = Retries(table, workers)  # second tries of what a dead preprocess worker held
        self.busy_until = 0.0  # monotonic s: no direct request before (another request was in flight lately)
        # how a direct request reaches the executor (the server's: the express lane, else the hub)
        self.send_direct = send_direct or (lambda frames: self.send("executor", frames))
        self.post_names = post_names  # every postprocess worker, live or restarting
        self.metrics, self.stats = metrics, stats
        self.handlers: dict[type, Callable[[Any, bytes], None]] = {
            m.Preprocessed: self.on_preprocessed, m.Inferred: self.on_inferred,
            m.Result: self.on_result, m.Failed: self.on_failed,
        }

    # -- sending a request on its way ----------------------------------------------
    def start(self, req: Request) -> None:
        """A newly admitted request: to a preprocess worker with the client's raw frame."""
        if req.kind is not STEP and self.fanout.owns(req):
            return self.fanout.start(req)
        self.table.add(req)
        self.dispatch(req)

    def dispatch(self, req: Request) -> None:
        now = time.monotonic()
        alone = self.alone(now)
        if self.direct(req, now, alone):
            return
        own = lambda name: self.holds_model(name, req.key)  # noqa: E731
        retries = self.retries.active  # a preprocess worker died lately: its requests' second tries go first
        worker = (self.retries.pick(req, now, own) if retries
                  else self.workers.pick_pre(now, self.table.busy, own))
        if worker is None:
            self.table.hold(req, PRE)
            return
        if not req.post:
            if self.workers.postprocessed_by_executor(req.key):  # a cheap chain: the executor answers
                self.table.route(req, EXEC)
            else:
                self.table.route(req, self.workers.pick(POST, now, self.table.post_load)
                                 or min(self.post_names, key=self.table.post_load))
        self.table.move(req, PRE, worker)
        upstream = 0 if req.degraded >= 2 else self.table.count_stage(req.key, PRE) - 1  # level 2: no waiting
        kind, link = req.kind, req.link
        crop, page = (link.crop, link.page) if kind is STEP else (None, 0)
        background = kind is GOLDEN and link.background
        task = m.PreTask(req.rid, req.model, req.version, req.deadline, req.trace, req.post, upstream,
                         req.degraded, crop, page, background=background, alone=alone and not background,
                         epoch=self.workers.epoch(req.post))
        if not self.send(worker, [m.encode(task), req.body]):  # it never got it: safe to hold
            self.workers.gone(worker)
            self.table.hold(req, PRE)
            return
        req.pre, req.dispatched = worker, now  # its frame stays until it leaves PRE: a second try resends it
        if retries and req.retried:
            self.retries.sent(req, worker)

    def holds_model(self, worker: str, key: str) -> bool:
        """Does ``worker`` hold a request of version ``key``?  (Asked only while some worker is stalled.)"""
        return any(r is not None and r.key == key for r in map(self.table.get, self.table.held_by(worker)))

    def alone(self, now: float) -> bool:
        """Nothing but the request being sent is in flight, nor was for ``DIRECT_QUIET_S``: the server is
        idle, not between two batches under load."""
        totals = self.table.stage_totals
        if totals[PRE] + totals[EXEC] + totals[POST] > 1:
            self.busy_until = now + DIRECT_QUIET_S
            return False
        return now >= self.busy_until

    def direct(self, req: Request, now: float, alone: bool) -> bool:
        """Send ``req`` straight to the executor when the module's doc says so; False: it was not."""
        if (req.body is None or req.kind is STEP or (req.kind is GOLDEN and req.link.background)
                or req.retried):  # a second try never: what may have crashed a preprocess worker stays there
            return False
        if not (len(req.body) <= self.direct_bytes if req.pixels is None  # a text or a tabular row
                else 0 < req.pixels <= self.direct_pixels  # an image: its decoding grows with its pixels
                and len(req.body) <= IMAGE_BYTES_PER_PIXEL * req.pixels + IMAGE_BYTES_SLACK):
            return False
        when = self.workers.preprocessed_by_executor(req.key, now)
        if not when or (when == IDLE and not alone  # the pool's turn, unless taken at any load
                        # or every preprocess worker is stalled on a slow request: a small text, row or
                        # tensor costs the executor microseconds, an image never goes this way under load
                        and (req.pixels is not None or not self.workers.pool_stalled(now, self.table.busy))):
            return False
        if not req.post:
            self.table.route(req, EXEC)
        task = m.PreTask(req.rid, req.model, req.version, req.deadline, req.trace, req.post, 0, req.degraded,
                         alone=alone, epoch=self.workers.epoch(req.post))
        if not self.send_direct([m.encode(task), req.body]):  # it never got it: the pool's way then
            self.workers.gone("executor")
            return False
        self.table.move(req, EXEC, "executor")
        req.pre, req.dispatched, req.body = "executor", now, None
        return True

    def direct_view(self) -> dict[str, Any]:
        """The direct route's limits now, for ``health``: 0 turns one off; ``images_off`` says why images
        were turned off at run time."""
        return {"bytes": self.direct_bytes, "pixels": self.direct_pixels,
                "images_off": self.images_off or None}

    def release_waiting(self, role: str) -> None:
        """A worker of ``role`` said hello: send it what waited for one."""
        for req in self.table.take_waiting(role):
            self.dispatch(req)

    # -- notices and answers from the workers ---------------------------------------
    def on_preprocessed(self, msg: m.Preprocessed, ident: bytes) -> None:
        for rid, ref in zip(msg.rids, msg.refs):
            req = self.table.get(rid)
            if req is None:  # answered already: its slot goes on to the executor all the same
                self.ghost_passed(rid, ident, EXEC, ref)
                continue
            if req.stage != PRE or req.holder.encode() != ident:
                continue  # the executor's notice came first
            self.metrics.worker.labels(PRE, req.holder).inc()
            self.table.move(req, EXEC, "executor")
            self.table.pass_on(req, ref)
            req.body = None
            self.fail_if_holder_died(req)

    def on_inferred(self, msg: m.Inferred, ident: bytes) -> None:
        if ident != b"executor":
            return
        for rid, ref in msg.each():
            req = self.table.get(rid)
            if req is None:
                self.ghost_passed(rid, ident, POST, ref)
                continue
            if req.stage == POST:
                continue
            self.credit_through(req)
            self.table.move(req, POST, req.post)
            self.table.pass_on(req, ref)
            req.body = None
            self.fail_if_holder_died(req)

    def ghost_passed(self, rid: int, ident: bytes, stage: str, ref: m.Ref) -> None:
        """A notice about an answered request: if the worker its slot went to died since the request
        was sent, nobody will free that slot but us (``table``'s ghosts)."""
        g = self.table.ghost_passed(rid, ident, stage, ref)
        if g is not None and self.workers.died_since(g.holder, g.since):
            self.table.unhaunt(rid)
            self.table.stray(ref)

    def credit_through(self, req: Request) -> None:
        """Count the stages from ``req.stage`` up to postprocessing as finished by their workers.
        Notices travel on different sockets and may overtake each other or the result; a late one is
        skipped, so whoever moves the request past a stage credits it."""
        if req.stage == PRE or req.pre == EXEC:  # the executor preprocessed it itself (``direct``)
            self.metrics.worker.labels(PRE, req.pre).inc()
        if req.stage in (PRE, EXEC):
            self.metrics.worker.labels(EXEC, "executor").inc()

    def fail_if_holder_died(self, req: Request) -> None:
        """A notice can arrive after the death of the worker it hands the request to: that worker's
        ``WorkerDown`` found nothing of it to answer, and its restarted self never got the task.
        Answer it now and free the slot (a stale copy in an inbox is skipped by ``Ring.holds``)."""
        if self.workers.died_since(req.holder, req.dispatched):
            self.fail(req.rid, p.UNAVAILABLE, f"{req.holder} exited while the request was on its way to it",
                      holder_dead=True)

    def on_result(self, msg: m.Result, ident: bytes) -> None:
        req = self.table.get(msg.rid)
        if req is None:
            self.table.unhaunt(msg.rid)  # its route ended: the postprocess worker freed what it read
            return
        if req.post.encode() != ident:
            return
        now = time.monotonic()
        self.weigh_direct_image(req, msg.trail.pre_sent - msg.trail.pre_started)
        self.table.finish(msg.rid)
        kind = req.kind
        if kind is SHADOW:  # a shadow copy: compared, never answered or counted
            return self.mirror.shadow_end(req, msg.outputs, "OK", now)
        if kind is STEP:  # a pipeline's step: its page goes on
            return self.fanout.child_end(req, msg.outputs, "OK", "", msg.trail)
        try:  # bookkeeping; an error here must not lose the answer (the request has left the table)
            self.credit_through(req)
            self.metrics.worker.labels(POST, req.post).inc()
            req.timing.update(stage_times(req, msg.trail, now))
        except Exception:
            log.exception("bookkeeping of an answer failed")
        self.answers.ok(req, msg, req.timing, now)  # a client's to its socket, a golden case's to its load
        self.mirror.primary_end(req, msg.outputs, now)

    def on_failed(self, msg: m.Failed, ident: bytes) -> None:
        req = self.table.get(msg.rid)
        if req is None or ident.decode() not in (req.pre, "executor", req.post):
            if req is None:
                self.table.unhaunt(msg.rid)
            self.table.stray(msg.ref)
            return
        if req.retried and req.stage == PRE and msg.message == m.PRE_WORKER_GONE:
            return  # the dead worker's copy, which the executor could not read: the second try goes on
        if msg.ref is not None:
            self.table.take(req, msg.ref)
        if msg.stage == "preprocess":  # no trail: from its dispatch, the executor starts on it at once
            self.weigh_direct_image(req, time.monotonic() - req.dispatched)
        if msg.steps and req.kind is not SHADOW:  # a step ran past its limit: the report counts it
            self.stats.add_steps(req.model, msg.steps)
        self.metrics.worker.labels(msg.stage or req.stage, ident.decode()).inc()
        self.fail(msg.rid, msg.code, msg.message, model_fault=ident == b"executor" and msg.code == p.INTERNAL,
                  ghost=False)

    def on_worker_down(self, worker: str, pid: int, exitcode: int) -> int:
        """The supervisor saw ``worker`` die: answer what it held (its slots are ours to free), but for the
        second tries of what it held at PRE (``retries``); returns how many it answered."""
        self.workers.down(worker, pid, time.monotonic())
        self.retries.down(worker)
        held = sorted(self.table.held_by(worker))  # rids grow: oldest first, as they came
        if self.direct_pixels and any(self.decoding_in_executor(self.table.get(rid)) for rid in held):
            # a decoder that crashes must cost a preprocess worker, not the executor and every model with it:
            # whatever killed it, images take the pool for the rest of this frontend's life
            self.direct_pixels = 0
            self.images_off = f"the executor exited (code {exitcode}) holding an image it decoded itself"
            log.warning("%s: images go through the preprocess pool from now on", self.images_off)
        self.table.ghosts_of(worker)  # answered requests' slots it held: nobody else will free them
        why = f"{worker} exited (code {exitcode}) while holding the request"
        if worker in self.stuck:
            self.stuck.discard(worker)
            why = (f"{worker} was replaced: it worked on one request for over AIENG_PREPROCESS_BUDGET_MS "
                   f"({self.pre_budget_ms:.0f} ms)")
        failed = [rid for rid in held if not self.second_try(self.table.get(rid))]
        for rid in failed:
            self.fail(rid, p.UNAVAILABLE, why, holder_dead=True)
        if len(failed) < len(held):
            log.warning("%s: %d requests it held get a second try", worker, len(held) - len(failed))
        return len(failed)

    def second_try(self, req: Request | None) -> bool:
        """A request a dead preprocess worker held: queued for its second try (``retries``)?  Not a step
        whose page was answered already (nobody would read it)."""
        return (req is not None and (req.kind is not STEP or bool(self.fanout.step_of(req.link.page)))
                and self.retries.second_try(req))

    def mark_stuck(self, workers: list[str]) -> None:
        """``workers`` are reported stuck to the supervisor now, which replaces them: their requests' errors
        will say why.  One that spoke again since is no longer stuck."""
        for worker in set(workers) - self.stuck:
            log.error("%s has worked on one request for over %.0f ms: asking for its replacement", worker,
                      self.pre_budget_ms)
        self.stuck = set(workers)

    def weigh_direct_image(self, req: Request, decode_s: float) -> None:
        """An image the executor decoded itself (``direct``) took ``decode_s``: past the budget, images
        take the pool from now on, so a slow one (whatever its cause) costs every model once, not at each
        repeat."""
        if not (self.direct_pixels and self.decoding_in_executor(req)
                and decode_s > self.direct_image_budget_s):
            return
        self.direct_pixels = 0
        self.images_off = (f"the executor took {decode_s * 1000:.0f} ms to decode an image, over "
                           f"AIENG_INLINE_IMAGE_BUDGET_MS ({self.direct_image_budget_s * 1000:.0f} ms)")
        log.warning("%s: images go through the preprocess pool from now on", self.images_off)

    @staticmethod
    def decoding_in_executor(req: Request | None) -> bool:
        """An image request the executor took straight from the frontend (``direct``), not yet answered."""
        return req is not None and req.pixels is not None and req.pre == EXEC

    # -- ending a request with an error ---------------------------------------------
    def fail(self, rid: int, code: str, message: str, holder_dead: bool = False,
             model_fault: bool = False, ghost: bool = True) -> None:
        """Answer ``rid`` with an error.  ``ghost=False`` only where its holder itself reported the
        failure (its route ends there); otherwise its slot may still be on its way (``table``)."""
        req = self.table.finish(rid, holder_dead, ghost=ghost and not holder_dead)
        if req is None:
            return
        if req.retried:
            self.retries.ended(rid)
        kind = req.kind
        if kind is STEP:  # a pipeline's step: its page is answered with the step named
            return self.fanout.child_end(req, None, code, message)
        self.fanout.page_failed(rid, code)  # a pipeline page: its step requests end with it
        if kind is SHADOW:
            return self.mirror.shadow_end(req, None, code, time.monotonic())
        self.answers.error(req, code, message, model_fault)
        self.mirror.primary_end(req, None, time.monotonic())

    def sweep(self, now: float) -> None:
        self.table.prune_ghosts(now)
        for rid in self.table.expired(now):
            req = self.table.get(rid)
            if req.stage == EXEC:  # a direct image still in the executor at its deadline: slow to decode
                self.weigh_direct_image(req, now - req.dispatched)
            where = req.stage if req.holder else f"waiting for a {req.stage} worker"
            step = self.fanout.step_of(rid)
            where = f"step: {step}" if step else f"stage: {where}"
            self.fail(rid, p.TIMEOUT, f"no answer within the deadline ({where})")
        if self.retries.active:  # a worker freed up, or a second try went: offer the hold queue again
            self.retries.prune()
            self.release_waiting(PRE)

    def answer_pipeline(self, req: Request, outputs: bytes, timing: dict[str, int], extra: dict) -> None:
        """A pipeline page's answer (``fanout``); its steps show as the model's steps in the report."""
        now = time.monotonic()
        if self.table.finish(req.rid) is None:
            return
        if req.kind is SHADOW:  # a shadow copy of a pipeline request: compared, never answered
            return self.mirror.shadow_end(req, outputs, "OK", now)
        self.answers.page(req, outputs, timing, extra, now)
        self.mirror.primary_end(req, outputs, now)

    def fail_all(self, code: str, message: str) -> int:
        rids = list(self.table.items)
        for rid in rids:
            self.fail(rid, code, message)
        return len(rids)
