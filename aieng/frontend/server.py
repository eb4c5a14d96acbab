"""The frontend process: the only one that talks to clients, and the hub; the composition root.

Three ROUTER sockets, one thread: clients (``Config.frontend_addr``: one msgpack map in, one out), the hub
(every worker, the gateways and the supervisor) and admin (routing and version changes).  This module
builds every component with what it needs and wires them, and keeps the loop and the sockets; what
happens to a message is decided by the components: ``clients`` (rate limits), ``ops`` (health, models, stats,
log_level), ``admission`` (an ``infer`` map -> request, immediate answer or refusal), ``pipeline`` (the
stages, one answer per request), ``versions`` (loads, golden sets, unloads, the lazy pool), ``mirror``
(shadow copies).  No CPU-heavy work happens here.  On the way down every request still in flight is
answered UNAVAILABLE before the client socket closes.
"""
from __future__ import annotations

import time
from typing import Any

import zmq

from aieng.config import Config
from aieng.frontend.control.admin import AdminOps, AdminServer
from aieng.frontend.control.lifecycle import Lifecycle
from aieng.frontend.control.ops import ClientOps
from aieng.frontend.control.views import Views
from aieng.frontend.control.workers import Workers
from aieng.frontend.observe.driftstore import build_drift
from aieng.frontend.observe.http import HttpServer, probe_tls
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.observe.snapshot import Snapshots
from aieng.frontend.observe.stats import StageStats
from aieng.frontend.observe.tracing import Tracing
from aieng.frontend.observe.window import RollingWindow
from aieng.frontend.requests.admission import Admission, Immediate
from aieng.frontend.requests.answers import Answers
from aieng.frontend.requests.breaker import Breakers
from aieng.frontend.requests.cache import ResponseCache
from aieng.frontend.requests.clients import ClientGate, client_socket, owner_of, peer_of, via_of
from aieng.frontend.requests.degrade import Degrader
from aieng.frontend.requests.fanout import Fanout
from aieng.frontend.requests.pipeline import Pipeline
from aieng.frontend.requests.table import Request, RequestTable
from aieng.frontend.rollout.mirror import Mirror
from aieng.frontend.rollout.rollout import Rollout, model_dirs
from aieng.frontend.rollout.routestore import RouteStore, store_path
from aieng.frontend.rollout.statewriter import StateWriter
from aieng.frontend.rollout.watcher import ConfigWatcher, model_yaml_paths
from aieng.frontend.versions.manager import VersionManager
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.models.served import ServedVersions
from aieng.runtime import procutil
from aieng.runtime.hub import dispatch
from aieng.wire import express, lanes, shm
from aieng.wire import messages as m
from aieng.wire import protocol as p
from aieng.wire.addresses import express_path, hub_addr, lane_path


class Frontend:
    def __init__(self, cfg: Config, specs: dict[str, ModelSpec], worker: str, log):
        self.cfg, self.log = cfg, log
        # the served versions: every component reads them; only the version manager writes (claim_writer)
        self.specs = ServedVersions.of(specs.values())
        self.life = Lifecycle()
        self.init_policy()
        self.init_sockets()

    def init_policy(self) -> None:
        cfg = self.cfg
        self.table, self.workers = RequestTable(), Workers(cfg.left_out)
        self.metrics, self.stats = Metrics(), StageStats()
        # spans per stage over OTLP when the OTEL_* variables name a collector; else ids only
        self.tracing = Tracing.from_env(self.metrics.spans_sent, self.metrics.spans_lost)
        self.breakers = Breakers(cfg.breaker_failures, cfg.breaker_cooldown_s)
        self.cache, self.degrader = ResponseCache(cfg.cache_bytes), Degrader(self.specs)
        # drift references built from traffic are saved beside the routing state by a writer of their own
        self.drift, self.drift_writer = build_drift(cfg, self.specs)
        store = RouteStore(store_path(cfg.state_dir, cfg.model_repository)) if cfg.state_dir else None
        # The state file is written off the loop, by one thread (statewriter); none without a state dir.
        self.writer = StateWriter(store.save, store.path, self.metrics.state_write) if store else None
        if store is None:
            self.log.warning("AIENG_STATE_DIR is empty: routing changes are not saved (lost at a restart)")
        # every model.yaml is watched by a thread; rollout.tick applies what changed (a fleet's one source)
        self.watcher = ConfigWatcher(model_yaml_paths(model_dirs(self.specs)))
        self.rollout = Rollout(self.specs, store, self.writer, self.metrics, self.watcher)
        self.gate = ClientGate(cfg.client_rate_limit, cfg.max_ops_per_s)
        self.admission = Admission(cfg, self.specs, self.rollout, self.table, self.breakers,
                                   self.cache, self.degrader, self.life, self.tracing)
        posts = [f"post-{j}" for j in range(cfg.postprocess_workers)]
        # every answer: counted, cached, measured; the auto-rollback watches each (rollout.observe), and
        # the status page's last minute counts each when the probe port is on (no work when it is off)
        self.window = RollingWindow(time.monotonic()) if cfg.http_addr else None
        self.answers = Answers(self.reply, self.metrics, self.stats, self.breakers, self.cache, self.drift,
                               self.degrader, self.rollout.observe if self.window is None else self.outcome,
                               self.tracing)
        # The pipeline ends what the mirror and the fan-out start, and they start requests (and end pages)
        # through it: a true cycle.  They are built first, over narrow callables into the pipeline built next
        # (called when a request moves, never while building); the pipeline gets both at construction.
        def start(req: Request) -> None:
            self.pipeline.start(req)

        self.mirror = Mirror(cfg, self.specs, self.rollout, self.admission, self.table, start,
                             self.metrics.registry)  # shadow copies and their comparison
        fanout = Fanout(self.table, self.workers, self.specs, start,  # pipeline models' steps
                        lambda rid, code, message: self.pipeline.fail(rid, code, message),
                        lambda page, outputs, timing, extra: self.pipeline.answer_pipeline(page, outputs,
                                                                                            timing, extra))
        self.pipeline = pl = Pipeline(self.table, self.workers, posts, self.send_task, self.answers,
                                      self.metrics, self.stats, self.mirror, fanout,
                                      cfg.inline_preprocess_bytes, self.send_direct, cfg.inline_image_pixels,
                                      cfg.inline_image_budget_ms / 1000, cfg.preprocess_budget_ms)
        self.versions = VersionManager(cfg, self.specs, self.send_hub, self.workers, self.rollout, pl.start,
                                       self.table, self.metrics, self.answers.refuse)
        self.views = Views(breakers=self.breakers.view, degradation=self.degrader.view,
                           cache=lambda: self.cache.view() if self.cache.enabled else None,
                           clients=self.gate.view, counts=self.answers.counts.view,
                           pool=self.versions.pool_view, routing=self.rollout.view, drift=self.drift.view,
                           direct=pl.direct_view,
                           lanes=lambda: self.workers.lanes(self.lanes.counts()))
        self.ops = ClientOps(self.workers, self.life, self.table, self.specs, self.rollout, self.stats,
                             self.mirror, self.send_hub, self.views, self.log, self.cfg.client_admin_ops)
        self.handlers = dict(self.pipeline.handlers)
        self.handlers.update(self.versions.handlers)
        self.handlers.update({m.Hello: self.on_hello, m.WorkerDown: self.on_worker_down,
                              m.ServiceState: self.on_state, m.Drain: self.on_drain,
                              m.Reload: self.on_reload})

    def init_sockets(self) -> None:
        self.ctx = zmq.Context.instance()
        self.clients, self.auth = client_socket(self.ctx, self.cfg, self.log)
        self.hub = self.ctx.socket(zmq.ROUTER)
        self.hub.setsockopt(zmq.LINGER, 0)
        self.hub.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone worker raises: we hold the request
        self.hub.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted worker takes its name back
        self.hub.setsockopt(zmq.SNDHWM, 0)
        self.hub.setsockopt(zmq.RCVHWM, 0)
        self.hub.bind(hub_addr(self.cfg.runtime_dir))
        self.express = express.FrontendEnd(express_path(self.cfg.runtime_dir))  # to the executor, when up
        rdir = self.cfg.runtime_dir  # the pools' lanes: tasks out, notices and answers in (wire/lanes)
        self.lanes = lanes.LaneEnds("frontend", lambda name: lane_path(rdir, name), self.cfg.pool_lanes)
        self.poller = zmq.Poller()
        self.admin = AdminServer(self.cfg, AdminOps(self.rollout, self.mirror, self.versions, self.workers,
                                                    self.specs, self.log, self.ops.wide_ops()), self.log)
        self.http = HttpServer(self.cfg.http_addr, lambda: self.snapshots.current, self.metrics.render,
                               self.cfg.http_token_file, self.cfg.http_threads, self.cfg.http_timeout_s,
                               self.cfg.snapshot_ms, self.metrics.dropped_connection,
                               probe_tls(self.cfg, self.log)) if self.cfg.http_addr else None
        self.snapshots = Snapshots(self.metrics, self.table, self.stats, self.drift, self.life, self.workers,
                                   self.specs, self.ops.health, self.views,
                                   self.http.debug_asked if self.http is not None else None, self.window)

    def outcome(self, model: str, version: str, code: str, seconds: float) -> None:
        """Every answer, with the probe port on: the auto-rollback's watch and the status page's minute."""
        self.rollout.observe(model, version, code, seconds)
        self.window.add(model, version, code, seconds, time.monotonic())

    # -- main loop ----------------------------------------------------------------
    def run(self, stop: procutil.StopFlag) -> None:
        poller = self.poller
        poller.register(self.clients, zmq.POLLIN)
        poller.register(self.hub, zmq.POLLIN)
        poller.register(self.admin.sock, zmq.POLLIN)
        writer_fd = self.writer.fileno() if self.writer is not None else None
        if writer_fd is not None:
            poller.register(writer_fd, zmq.POLLIN)  # the state writer's "done": admin answers go out
        self.lanes.register(poller)
        next_pulse = next_snapshot = 0.0
        while not stop.stop:
            now = time.monotonic()
            if now >= next_pulse:
                self.pulse(now)
                self.degrader.update(self.table.per_model())
                self.rollout.tick(now)
                self.versions.tick(now)
                if self.drift_writer is not None:
                    self.drift_writer.poll()  # nobody waits on its tickets: this only clears them
                next_pulse = now + 0.5
            if now >= next_snapshot:
                self.snapshots.publish(now)
                next_snapshot = now + self.cfg.snapshot_ms / 1000
            nxt = self.table.next_deadline()
            timeout = 100 if nxt is None else max(0, min(100, int((nxt - now) * 1000) + 1))
            events = dict(poller.poll(timeout))
            self.drain_lanes(events)  # first: what a worker sent before it died precedes its WorkerDown
            if self.hub in events:
                self.drain_hub()
            if any(self.express.watches(fd) for fd in events):
                self.drain_express()
            if self.clients in events:
                self.drain_clients()
            if self.admin.sock in events:
                self.admin.drain()
            if writer_fd is not None and writer_fd in events:
                self.writer.poll()
            now = time.monotonic()
            self.pipeline.sweep(now)
            self.versions.sweep(now)
            self.check_drain(now)

    def pulse(self, now: float) -> None:
        # read the heartbeats waiting first: after a long pass of this loop (a reload, a big admin op, a
        # starved core) they are queued, and a worker would look silent, even stuck, for the loop's own pause
        self.drain_lanes()
        self.drain_hub()
        roles = self.workers.count(now)
        healthy = self.life.started and all(roles.values())
        stuck = self.workers.stuck(now, self.cfg.preprocess_budget_ms / 1000, self.table.busy)
        self.pipeline.mark_stuck(stuck)
        self.send_hub("supervisor", [m.encode(m.Pulse(healthy, self.workers.silence(now), stuck))])

    def drain_hub(self) -> None:
        for _ in range(1000):
            try:
                frames = self.hub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.dispatch(frames[1].buffer, frames[0].bytes)

    def drain_lanes(self, ready=None) -> None:
        """The pool lanes' records waiting (``ready``: the fds a poll found readable; None: look at all)."""
        for ident, data, _ in self.lanes.poll(self.poller, ready):
            self.dispatch(data, ident)

    def drain_express(self) -> None:
        for data in self.express.drain(self.poller):  # the executor's answers to direct requests
            self.dispatch(data, b"executor")

    def dispatch(self, data, ident: bytes) -> None:
        dispatch(data, self.handlers, self.log, repr(ident), ident)

    def drain_clients(self) -> None:
        for _ in range(1000):
            try:
                frames = self.clients.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.on_client(frames)

    def check_drain(self, now: float) -> None:
        deadline = self.life.drain_deadline
        busy = len(self.table) or self.versions.waiters()
        if deadline is None or (busy and now < deadline):
            return
        self.versions.fail_all(p.UNAVAILABLE, "server is shutting down")
        self.pipeline.fail_all(p.UNAVAILABLE, "server is shutting down")
        if deadline != float("inf"):
            self.send_hub("supervisor", [m.encode(m.Drained(0))])
            self.life.drained()

    # -- clients --------------------------------------------------------------------
    def on_client(self, frames: list) -> None:
        envelope = [f.bytes for f in frames[:-1]]
        body = frames[-1]
        received = time.monotonic()
        if len(body) > self.cfg.max_message_bytes:
            return self.refuse(envelope, f"message of {len(body)} bytes is over the "
                                         f"{self.cfg.max_message_bytes}-byte limit")
        try:
            req = p.unpack_limited(body.buffer, self.cfg.max_message_bytes)
        except Exception as exc:
            return self.refuse(envelope, f"malformed msgpack: {type(exc).__name__}")
        if not isinstance(req, dict):
            return self.refuse(envelope, "a request must be a msgpack map")
        req_id = req.get("id")
        if req_id is not None and not p.valid_id(req_id):
            return self.refuse(envelope, "'id' must be a str or an int")
        op = req.get("op", "infer")
        via = via_of(req, self.cfg.gateway_token)  # an OIP request's principal (or address)
        owner = owner_of(frames[0], via, self.auth is not None)  # whose rates and share (clients.py)
        why = self.gate.allow(owner, op == "infer", received)
        if why is not None:
            self.answers.count_error(p.OVERLOADED, *Admission.labels_of(req, self.specs))
            return self.reply(envelope, p.error_body(req_id, p.OVERLOADED, why))
        if op != "infer":
            answer = self.ops.handle(op, req_id, req) if isinstance(op, str) else None
            if answer is None:
                return self.refuse(envelope, f"unknown op {op!r}", req_id)
            return self.reply(envelope, p.pack_map(answer))  # the models list spliced in as kept (packed)
        self.answers.admitted()
        try:
            decision = self.admission.admit(req, owner, received)
        except p.RequestError as exc:
            self.answers.count_error(exc.code, *Admission.labels_of(req, self.specs))
            return self.reply(envelope, p.error_body(req_id, exc.code, exc.message))
        if isinstance(decision, Immediate):
            return self.answers.immediate(envelope, req_id, decision, received)
        a = decision
        r = Request(self.table.new_rid(), envelope, req_id, a.model, a.version, a.deadline, received,
                    a.params, trace=a.trace, probe=a.probe, cache_key=a.cache_key, degraded=a.degraded,
                    body=body, route=a.route, tctx=a.tctx, pixels=a.pixels,
                    peer=peer_of(frames[0], via), owner=owner)
        self.log.debug("admitted %s:%s", a.model, a.version, extra={"trace": a.trace})
        if self.versions.start(r, req["inputs"]):  # else it waits for its cold load (no shadow copy then)
            self.mirror.after_admit(r, body)  # after the primary is on its way: a shadow never delays it

    def refuse(self, envelope: list, message: str, req_id: Any = None) -> None:
        """INVALID_REQUEST for a message that never became a request (counted, model unknown)."""
        self.answers.count_error(p.INVALID_REQUEST)
        self.reply(envelope, p.error_body(req_id, p.INVALID_REQUEST, message))

    def reply(self, envelope: list, body: bytes) -> None:
        try:
            self.clients.send_multipart(envelope + [body], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # this client's send queue is full: it does not read its replies
            self.gate.dropped["full"] += 1
        except zmq.ZMQError:  # EHOSTUNREACH: the client is gone
            self.gate.dropped["gone"] += 1

    # -- hub --------------------------------------------------------------------------
    def send_hub(self, worker: str, frames: list) -> bool:
        try:
            self.hub.send_multipart([worker.encode()] + frames, copy=False)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH: not connected (dead or restarting)
            return False

    def send_task(self, worker: str, frames: list) -> bool:
        """A request's ``PreTask`` and frame to a preprocess worker: its lane, else the hub."""
        body = frames[1]
        if self.lanes.out.send(worker, frames[0], getattr(body, "buffer", body)):
            return True
        return self.send_hub(worker, frames)

    def send_direct(self, frames: list) -> bool:
        """A request sent straight to the executor (``pipeline.direct``): express lane, else hub."""
        body = frames[1]
        return (self.express.send(frames[0], getattr(body, "buffer", body))
                or self.send_hub("executor", frames))

    def on_hello(self, msg: m.Hello, ident: bytes) -> None:
        now = time.monotonic()
        if msg.role == "executor":  # (re)connect the express lane to this executor process
            self.express.executor_seen(msg.pid, self.poller)
        if self.workers.hello(msg, now):
            self.log.info("%s (pid %d) is up", msg.worker, msg.pid)
            self.ops.joined(msg.worker)  # a log level changed at run time reaches it too
            self.admission.set_failed(self.workers.failed_models())
            self.snapshots.publish(now, full=False)  # health over HTTP follows at once
        if self.table.waiting.get(msg.role):
            self.pipeline.release_waiting(msg.role)

    def on_worker_down(self, msg: m.WorkerDown, ident: bytes) -> None:
        if msg.worker == "executor":
            self.express.drop(self.poller)
        held = self.pipeline.on_worker_down(msg.worker, msg.pid, msg.exitcode)
        self.versions.on_worker_down(msg.worker, msg.exitcode)
        self.table.rings.forget(f"{shm.PREFIX}{self.cfg.instance}.{msg.worker}.")
        self.snapshots.publish(time.monotonic(), full=False)
        if held:
            self.log.warning("%s died: answered %d requests UNAVAILABLE", msg.worker, held)

    def on_state(self, msg: m.ServiceState, ident: bytes) -> None:
        if self.life.on_state(msg, time.monotonic()):
            self.snapshots.publish(time.monotonic(), full=False)

    def on_drain(self, msg: m.Drain, ident: bytes) -> None:
        self.log.info("draining: %d in flight, grace %.1fs", len(self.table), msg.grace_s)
        self.life.drain(time.monotonic() + msg.grace_s)

    def on_reload(self, msg: m.Reload, ident: bytes) -> None:
        # version directories first: loads finish in the background
        dirs = self.versions.rescan()
        moves = "; ".join(f"{k}: {', '.join(v)}" for k, v in dirs.items() if v)
        try:
            changed = self.rollout.reload_from_disk()
            ok, text = True, f"routing reloaded; changed: {', '.join(changed) or 'nothing'}"
        except model_repo.ModelError as exc:
            ok, text = False, f"routing reload refused, routing unchanged: {exc}"
        text += f"; versions: {moves or 'no change'}"
        (self.log.info if ok else self.log.error)("%s", text)
        self.send_hub("supervisor", [m.encode(m.Reloaded(ok, text))])

    def close(self) -> None:
        # On the way down every message already received is answered too: infer requests still
        # queued in the client socket get UNAVAILABLE (draining), then everything in flight.
        self.life.drain()
        self.drain_clients()
        answered = self.versions.fail_all(p.UNAVAILABLE, "server is shutting down")
        answered += self.pipeline.fail_all(p.UNAVAILABLE, "server is shutting down")
        if answered:
            self.log.warning("stopping: answered %d requests in flight UNAVAILABLE", answered)
        if self.http is not None:
            self.http.close()
        self.clients.close(linger=500)
        if self.auth is not None:
            self.auth.stop()
        self.hub.close(0)
        self.express.close()
        self.lanes.close()
        self.admin.close()
        self.watcher.close()
        if self.writer is not None:  # what waits is written before the process ends
            self.writer.close()
        if self.drift_writer is not None:
            self.drift_writer.close()
        self.versions.close()
        self.table.close()
        self.tracing.close()  # bounded (tracing.CLOSE_S): a gone collector never holds the stop
