"""The frontend process: the only one that talks to clients, and the hub.

Two ROUTER sockets, one thread:
  * clients (``Config.frontend_addr``): one msgpack map in, one map out;
  * the hub (``ipc://<runtime>/hub.sock``): every worker and the supervisor.

It validates requests, keeps the table of requests in flight, routes each
one stage to the next (least-loaded live worker of each role), stamps the
time of every hand-off, answers TIMEOUT when a deadline passes and
UNAVAILABLE for the requests a dead worker held, and frees the
shared-memory slot of any request that ends while it is responsible for it.
No CPU-heavy work happens here.
"""
from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any

import zmq

from aieng import messages as m
from aieng import procutil, protocol as p, shm
from aieng.addresses import hub_addr
from aieng.config import Config
from aieng.frontend.breaker import Breakers
from aieng.frontend.cache import ResponseCache, cache_key
from aieng.frontend.degrade import Degrader
from aieng.frontend.drift import DriftMonitor
from aieng.frontend.http import HttpServer
from aieng.frontend.metrics import Metrics
from aieng.frontend.procinfo import gpu_usage, process_memory
from aieng.frontend.stats import StageStats
from aieng.frontend.table import EXEC, POST, PRE, Request, RequestTable
from aieng.model_repo import ModelSpec, latest

WORKER_SILENCE_S = 5.0  # no heartbeat for this long: stop routing to it


class Frontend:
    def __init__(self, cfg: Config, specs: dict[str, dict[str, ModelSpec]], log):
        self.cfg, self.log = cfg, log
        self.specs = specs
        self.default_version = {name: latest(vs) for name, vs in specs.items()}
        self.table = RequestTable()
        self.rings = shm.RingCache()
        self.workers: dict[str, dict] = {}  # name -> {role, pid, seen, info}
        self.dead_pids: set[int] = set()
        self.turn = 0  # a dead worker's last hellos may still sit in our queue
        self.ready = False  # every process is up and ready (supervisor's view)
        self.started_ok = False  # the service has been fully ready once: admit requests from then on
        self.draining_until: float | None = None
        self.state: dict = {"processes": {}, "restarts": {}}
        self.started = time.time()
        self.counts = {"requests": 0, "ok": 0, "errors": {}}
        self.stats = StageStats()
        self.metrics = Metrics()
        self.drift = DriftMonitor(specs)
        self.breakers = Breakers(cfg.breaker_failures, cfg.breaker_cooldown_s)
        self.cache = ResponseCache(cfg.cache_bytes)
        self.degrader = Degrader(specs)
        self.snapshot: dict = {}
        self.rss_at = 0.0
        self.handlers = {
            m.Hello: self.on_hello, m.Preprocessed: self.on_preprocessed, m.Inferred: self.on_inferred,
            m.Result: self.on_result, m.Failed: self.on_failed, m.WorkerDown: self.on_worker_down,
            m.ServiceState: self.on_state, m.Drain: self.on_drain,
        }
        self.init_sockets()

    def init_sockets(self) -> None:
        self.ctx = zmq.Context.instance()
        self.clients = self.ctx.socket(zmq.ROUTER)
        self.clients.setsockopt(zmq.LINGER, 1000)
        self.clients.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a client gone before its answer: drop it
        # ZMQ drops a connection on a message over MAXMSGSIZE; keep that far above our own
        # limit so an oversized request still gets its INVALID_REQUEST answer.
        self.clients.setsockopt(zmq.MAXMSGSIZE, 4 * self.cfg.max_message_bytes)
        self.clients.setsockopt(zmq.SNDHWM, 0)
        self.clients.setsockopt(zmq.RCVHWM, 0)
        if self.clients.getsockopt(zmq.IPV6) == 0 and self.cfg.frontend_addr.startswith("tcp://["):
            self.clients.setsockopt(zmq.IPV6, 1)
        self.auth = None
        if self.cfg.curve_secret_key_file:
            self.init_curve()
        self.clients.bind(self.cfg.frontend_addr)
        self.hub = self.ctx.socket(zmq.ROUTER)
        self.hub.setsockopt(zmq.LINGER, 0)
        self.hub.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone worker raises: we answer UNAVAILABLE
        self.hub.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted worker takes its name back
        self.hub.setsockopt(zmq.SNDHWM, 0)
        self.hub.setsockopt(zmq.RCVHWM, 0)
        self.hub.bind(hub_addr(self.cfg.runtime_dir))
        self.http = HttpServer(self.cfg.http_addr, lambda: self.snapshot, self.metrics.render,
                               self.cfg.http_token_file, self.cfg.http_threads, self.cfg.http_timeout_s,
                               self.cfg.snapshot_ms, self.metrics.dropped_connection
                               ) if self.cfg.http_addr else None

    def init_curve(self) -> None:
        """Encrypt the client socket with CURVE; with a keys dir, only those client keys get in."""
        import zmq.auth
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = zmq.auth.load_certificate(self.cfg.curve_secret_key_file)
        if secret is None:
            raise ValueError(f"{self.cfg.curve_secret_key_file} holds no secret key")
        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        if self.cfg.curve_client_keys_dir:
            self.auth.configure_curve(domain="*", location=self.cfg.curve_client_keys_dir)
        else:
            self.auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        self.clients.curve_secretkey = secret
        self.clients.curve_publickey = public
        self.clients.curve_server = True
        self.log.info("client socket encrypted with CURVE (%s)",
                      "allowed keys from " + self.cfg.curve_client_keys_dir if self.cfg.curve_client_keys_dir
                      else "any client key")

    # -- main loop ----------------------------------------------------------
    def run(self, stop: procutil.StopFlag) -> None:
        poller = zmq.Poller()
        poller.register(self.clients, zmq.POLLIN)
        poller.register(self.hub, zmq.POLLIN)
        next_pulse = 0.0
        while not stop.stop:
            now = time.monotonic()
            if now >= next_pulse:
                self.pulse(now)
                self.update_degradation()
                self.publish_snapshot(now)
                next_pulse = now + 0.5
            nxt = self.table.next_deadline()
            timeout = 100 if nxt is None else max(0, min(100, int((nxt - now) * 1000) + 1))
            events = dict(poller.poll(timeout))
            if self.hub in events:
                self.drain_hub()
            if self.clients in events:
                self.drain_clients()
            self.sweep(time.monotonic())

    def pulse(self, now: float) -> None:
        silent = {n: round(now - w["seen"], 3) for n, w in self.workers.items()}
        roles = {w["role"] for n, w in self.workers.items() if silent[n] <= WORKER_SILENCE_S}
        healthy = self.started_ok and roles >= {"preprocess", "executor", "postprocess"}
        try:
            self.hub.send_multipart([b"supervisor", m.encode(m.Pulse(healthy, silent))])
        except zmq.ZMQError:
            pass  # the supervisor is not connected yet

    def update_degradation(self) -> None:
        if not self.degrader.models:
            return
        per: dict[str, int] = {}
        for r in self.table.items.values():
            key = f"{r.model}:{r.version}"
            per[key] = per.get(key, 0) + 1
        self.degrader.update(per)

    def publish_snapshot(self, now: float) -> None:
        """What the HTTP thread may read: a fresh dict swapped in whole, never mutated after."""
        health = self.health(None)
        depth: dict[str, int] = {}
        for r in self.table.items.values():
            depth[r.stage] = depth.get(r.stage, 0) + 1
        self.metrics.in_flight.set(len(self.table))
        for stage in (PRE, EXEC, POST):
            self.metrics.queue.labels(stage).set(depth.get(stage, 0))
        snap = {"health": health, "queue_depth": depth, "counts": self.counts,
                "drift_psi": {"/".join(k): round(v, 4) for k, v in self.drift.scores().items()}}
        prev = self.metrics.snapshot
        msnap = {"restarts": dict(self.state["restarts"]), "ready": health["ready"],
                 "models": {(k.split(":")[0], k.split(":")[1], v or "none"): 1.0
                            for k, v in health["providers"].items()},
                 "rss": prev.get("rss", {}), "gpus": prev.get("gpus", {}), "drift": self.drift.scores()}
        if now >= self.rss_at or not msnap["rss"]:  # process memory every 2 s: a psutil call per process
            msnap["rss"] = process_memory(self.state["processes"])
            msnap["gpus"] = gpu_usage() if self.workers.get("executor", {}).get("info", {}).get(
                "runtime", {}).get("gpus") else {}
            self.rss_at = now + 2.0
        snap["memory"] = {f"{w}": v for (_, w), v in msnap["rss"].items()}
        snap["gpus"] = {str(i): {"memory_used_bytes": u, "utilization": g} for i, (u, g) in msnap["gpus"].items()}
        # /debug serves this, HTTP never calls into the loop.  The summary costs the loop milliseconds
        # (tens with full windows), so it is refreshed only after a /debug asked for it.
        asked = self.http is not None and self.http.debug_asked.is_set()
        if asked:
            self.http.debug_asked.clear()
        snap["stats"] = self.stats.summary(None) if asked else self.snapshot.get("stats", {})
        snap["in_flight"] = len(self.table)
        self.metrics.snapshot = msnap
        self.snapshot = snap

    def drain_hub(self) -> None:
        for _ in range(1000):
            try:
                frames = self.hub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = m.decode(frames[1].buffer)
            except Exception:
                self.log.exception("undecodable hub message from %r", frames[0].bytes)
                continue
            handler = self.handlers.get(type(msg))
            if handler is None:
                self.log.warning("no handler for %s from %r", type(msg).__name__, frames[0].bytes)
                continue
            handler(msg, frames[0].bytes)

    def drain_clients(self) -> None:
        for _ in range(1000):
            try:
                frames = self.clients.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.on_client(frames)

    def sweep(self, now: float) -> None:
        for rid in self.table.expired(now):
            req = self.table.get(rid)
            self.respond_error(rid, p.TIMEOUT, f"no answer within the deadline (stage: {req.stage})")
        if self.draining_until is not None and (not self.table.items or now >= self.draining_until):
            for rid in list(self.table.items):
                self.respond_error(rid, p.UNAVAILABLE, "server is shutting down")
            if self.draining_until != float("inf"):
                self.send_hub("supervisor", m.Drained(0))
                self.draining_until = float("inf")

    # -- clients ------------------------------------------------------------
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
        if op == "health":
            return self.reply(envelope, p.pack(self.health(req_id)))
        if op == "models":
            return self.reply(envelope, p.pack(self.models(req_id)))
        if op == "stats":
            return self.reply(envelope, p.pack(self.stats_view(req_id, req)))
        if op == "log_level":
            return self.reply(envelope, p.pack(self.set_log_level(req_id, req.get("level"))))
        if op != "infer":
            return self.refuse(envelope, f"unknown op {op!r}", req_id)
        self.counts["requests"] += 1
        try:
            self.admit(req, req_id, envelope, body, received)
        except p.RequestError as exc:
            model, version = req.get("model"), req.get("version")
            self.count_error(exc.code, model if isinstance(model, str) and model in self.specs else "",
                             version if isinstance(version, str) and len(version) < 64 else "")
            self.reply(envelope, p.error_body(req_id, exc.code, exc.message))

    def refuse(self, envelope: list, message: str, req_id: Any = None) -> None:
        """INVALID_REQUEST for a message that never became a request (counted, model unknown)."""
        self.count_error(p.INVALID_REQUEST)
        self.reply(envelope, p.error_body(req_id, p.INVALID_REQUEST, message))

    def admit(self, req: dict, req_id: Any, envelope: list, body, received: float) -> None:
        model, version = req.get("model"), req.get("version")
        if not isinstance(model, str):
            raise p.RequestError(p.INVALID_REQUEST, "'model' must be a string")
        if model not in self.specs:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"unknown model {model!r}")
        if version is None:
            version = self.default_version[model]
        if not isinstance(version, str) or version not in self.specs[model]:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"model {model!r} has no version {version!r}")
        if not isinstance(req.get("inputs"), dict):
            raise p.RequestError(p.INVALID_REQUEST, "'inputs' must be a map")
        params = req.get("params") or {}
        if not isinstance(params, dict):
            raise p.RequestError(p.INVALID_REQUEST, "'params' must be a map")
        spec = self.specs[model][version]
        timeout_ms = req.get("timeout_ms", min(spec.timeout_ms or self.cfg.default_timeout_ms, self.cfg.max_timeout_ms))
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not 0 < timeout_ms <= self.cfg.max_timeout_ms:
            raise p.RequestError(p.INVALID_REQUEST, f"'timeout_ms' must be an int in 1..{self.cfg.max_timeout_ms}")
        if self.draining_until is not None:
            raise p.RequestError(p.UNAVAILABLE, "server is shutting down")
        if not self.started_ok:
            raise p.RequestError(p.UNAVAILABLE, "server is not ready yet")
        key = None
        if self.cache.enabled:  # a hit costs nothing: served even when shedding or a breaker is open
            key = cache_key(model, version, req["inputs"], params)
            hit = self.cache.get(key)
            if hit is not None:
                us = int((time.monotonic() - received) * 1e6)
                self.metrics.requests.labels(model, version, "OK").inc()
                self.metrics.cache_hits.labels(model).inc()
                self.counts["ok"] += 1
                return self.reply(envelope, p.result_body(req_id, model, version, hit,
                                                          {"frontend_in": us, "total": us},
                                                          {"batch": 0, "cached": True}))
        level = self.degrader.level(spec.key)
        if level >= 3:  # the cache had nothing: the configured fallback, or shed
            fallback = self.degrader.fallback(spec.key)
            if fallback is None:
                raise p.RequestError(p.OVERLOADED, f"{spec.key} is degraded (level 3): shedding load")
            self.metrics.requests.labels(model, version, "OK").inc()
            self.counts["ok"] += 1
            us = int((time.monotonic() - received) * 1e6)
            return self.reply(envelope, p.result_body(req_id, model, version, p.pack(fallback),
                                                      {"frontend_in": us, "total": us},
                                                      {"batch": 0, "degraded": 3, "fallback": True}))
        if len(self.table) >= self.cfg.max_inflight:
            raise p.RequestError(p.OVERLOADED, f"{len(self.table)} requests in flight; try again later")
        worker = self.pick("preprocess")
        if worker is None:
            raise p.RequestError(p.UNAVAILABLE, "no preprocess worker is available")
        admit, probe, why = self.breakers.allow(spec.key, received)
        if not admit:
            raise p.RequestError(p.UNAVAILABLE, why)
        trace = req.get("trace_id")
        if not (isinstance(trace, str) and 0 < len(trace) <= 64 and trace.isprintable()):
            trace = secrets.token_hex(8)
        r = Request(self.table.new_rid(), envelope, req_id, model, version, received + timeout_ms / 1000.0,
                    received, params, trace=trace, probe=probe, cache_key=key, degraded=level)
        self.table.add(r)
        self.table.move(r, PRE, worker)
        r.stamps[PRE] = time.monotonic()
        r.timing["frontend_in"] = int((r.stamps[PRE] - received) * 1e6)
        self.log.debug("admitted %s:%s -> %s", model, version, worker, extra={"trace": trace})
        task = m.encode(m.PreTask(r.rid, model, version, r.deadline, trace))
        if not self.send_hub_frames(worker, [task, body]):
            self.respond_error(r.rid, p.UNAVAILABLE, "preprocess worker went away")

    def reply(self, envelope: list, body: bytes) -> None:
        try:
            self.clients.send_multipart(envelope + [body], copy=False)
        except zmq.ZMQError as exc:  # pragma: no cover - the client's pipe is gone
            self.log.debug("reply dropped: %s", exc)

    def respond_error(self, rid: int, code: str, message: str, holder_dead: bool = False) -> None:
        req = self.table.pop(rid)
        if req is None:
            return
        key = f"{req.model}:{req.version}"
        if code == p.INTERNAL and req.stage == EXEC:  # the model run itself failed
            self.breakers.failure(key, time.monotonic(), req.probe)
        else:
            self.breakers.neutral(key, req.probe)
        if req.ref is not None and (req.fe_owns or holder_dead):
            self.rings.free(req.ref[0], req.ref[1], req.ref[2])
        self.count_error(code, req.model, req.version)
        self.log.debug("answered %s at stage %s", code, req.stage, extra={"trace": req.trace})
        self.reply(req.envelope, p.error_body(req.client_id, code, message, req.trace))

    def count_error(self, code: str, model: str = "", version: str = "") -> None:
        self.counts["errors"][code] = self.counts["errors"].get(code, 0) + 1
        self.metrics.failed(model, version, code)

    # -- routing --------------------------------------------------------------
    def pick(self, role: str) -> str | None:
        """The live worker of ``role`` holding the fewest requests; ties go round-robin."""
        now = time.monotonic()
        names = [n for n, w in self.workers.items() if w["role"] == role and now - w["seen"] <= WORKER_SILENCE_S]
        if not names:
            return None
        self.turn += 1
        k = self.turn % len(names)
        rotated = names[k:] + names[:k]
        return min(rotated, key=self.table.load)

    def send_hub_frames(self, worker: str, frames: list) -> bool:
        try:
            self.hub.send_multipart([worker.encode()] + frames, copy=False)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH: not connected (dead or restarting)
            self.workers.pop(worker, None)
            return False

    def send_hub(self, worker: str, msg: Any) -> bool:
        return self.send_hub_frames(worker, [m.encode(msg)])

    # -- hub messages -----------------------------------------------------------
    def on_hello(self, msg: m.Hello, ident: bytes) -> None:
        if msg.pid in self.dead_pids:
            return
        w = self.workers.get(msg.worker)
        if w is None or w["pid"] != msg.pid:
            self.log.info("%s (pid %d) is up", msg.worker, msg.pid)
            self.workers[msg.worker] = w = {"role": msg.role, "pid": msg.pid, "info": msg.info}
            w["seen"] = time.monotonic()
            self.publish_snapshot(w["seen"])  # health over HTTP follows at once
        w["seen"] = time.monotonic()

    def held(self, rid: int, ident: bytes, stage: str) -> Request | None:
        """The request if ``ident`` holds it at ``stage``; else None (it was answered already)."""
        req = self.table.get(rid)
        if req is None or req.stage != stage or req.holder.encode() != ident:
            return None
        return req

    def on_preprocessed(self, msg: m.Preprocessed, ident: bytes) -> None:
        req = self.held(msg.rid, ident, PRE)
        if req is None:  # answered already (timeout): the slot is ours to free
            self.rings.free(msg.ref[0], msg.ref[1], msg.ref[2])
            return
        now = time.monotonic()
        self.metrics.worker.labels("preprocess", req.holder).inc()
        req.timing["preprocess"] = msg.pre_us
        req.timing["preprocess_queue"] = max(0, int((now - req.stamps[PRE]) * 1e6) - msg.pre_us)
        req.seq_len = msg.seq_len
        req.info = msg.info
        req.ref, req.fe_owns = msg.ref, True
        if self.pick("executor") is None:
            return self.respond_error(req.rid, p.UNAVAILABLE, "the executor is not available")
        upstream = self.table.count_stage(req.model, req.version, PRE) - 1
        if req.degraded >= 2:
            upstream = 0  # degradation level 2: do not wait to fill batches
        task = m.InferTask(req.rid, req.model, req.version, req.deadline, msg.ref, msg.seq_len, upstream, req.trace)
        self.table.move(req, EXEC, "executor")
        req.stamps[EXEC] = now
        if not self.send_hub("executor", task):
            return self.respond_error(req.rid, p.UNAVAILABLE, "the executor went away")
        req.fe_owns = False  # the executor frees the input slot from here on

    def on_inferred(self, msg: m.Inferred, ident: bytes) -> None:
        req = self.held(msg.rid, ident, EXEC)
        if req is None:
            self.rings.free(msg.ref[0], msg.ref[1], msg.ref[2])
            return
        now = time.monotonic()
        self.metrics.worker.labels("executor", req.holder).inc()
        req.timing["batch_wait"] = msg.wait_us
        req.timing["inference"] = msg.infer_us
        req.timing["handoff"] = max(0, int((now - req.stamps[EXEC]) * 1e6) - msg.wait_us - msg.infer_us)
        req.info["batch"] = msg.batch
        req.info["padded"] = msg.padded
        req.ref, req.fe_owns = msg.ref, True
        worker = self.pick("postprocess")
        if worker is None:
            return self.respond_error(req.rid, p.UNAVAILABLE, "no postprocess worker is available")
        self.table.move(req, POST, worker)
        req.stamps[POST] = now
        if not self.send_hub(worker, m.PostTask(req.rid, req.model, req.version, msg.ref,
                                               dict(req.params, _degraded=req.degraded) if req.degraded else req.params,
                                               req.info, req.trace)):
            return self.respond_error(req.rid, p.UNAVAILABLE, "postprocess worker went away")
        req.fe_owns = False  # the postprocess worker frees the output slot

    def on_result(self, msg: m.Result, ident: bytes) -> None:
        if self.held(msg.rid, ident, POST) is None:
            return
        req = self.table.pop(msg.rid)
        now = time.monotonic()
        self.metrics.worker.labels("postprocess", req.holder).inc()
        req.timing["postprocess"] = msg.post_us
        req.timing["postprocess_queue"] = max(0, int((now - req.stamps[POST]) * 1e6) - msg.post_us)
        req.timing["total"] = int((now - req.received) * 1e6)
        self.counts["ok"] += 1
        batch = req.info.get("batch", 1)
        self.breakers.success(f"{req.model}:{req.version}")
        if req.cache_key is not None:
            self.cache.put(req.cache_key, msg.outputs)
        self.metrics.answered(req.model, req.version, req.timing, batch, msg.confidence)  # before the reply
        self.drift.observe(req.model, req.version, req.info)
        extra = {"batch": batch, "trace_id": req.trace}
        if req.degraded:
            extra["degraded"] = req.degraded
        self.degrader.observe_latency(f"{req.model}:{req.version}", now - req.received)
        self.reply(req.envelope, p.result_body(req.client_id, req.model, req.version, msg.outputs, req.timing, extra))
        self.log.debug("answered OK in %d us", req.timing["total"], extra={"trace": req.trace})
        req.timing["frontend_out"] = int((time.monotonic() - now) * 1e6)
        self.stats.add(req.model, req.timing, batch, req.seq_len, req.info.get("padded", 0) or req.seq_len)

    def on_failed(self, msg: m.Failed, ident: bytes) -> None:
        req = self.table.get(msg.rid)
        if req is not None and req.holder.encode() != ident:
            req = None
        if req is None:
            if msg.ref:
                self.rings.free(msg.ref[0], msg.ref[1], msg.ref[2])
            return
        if msg.ref:
            req.ref, req.fe_owns = msg.ref, True
        self.metrics.worker.labels(req.stage, req.holder).inc()
        self.respond_error(msg.rid, msg.code, msg.message)

    def on_worker_down(self, msg: m.WorkerDown, ident: bytes) -> None:
        self.workers.pop(msg.worker, None)
        if len(self.dead_pids) > 10_000:
            self.dead_pids.clear()
        self.dead_pids.add(msg.pid)
        held = self.table.held_by(msg.worker)
        for rid in held:  # the dead worker can no longer free their slots: we do
            self.respond_error(rid, p.UNAVAILABLE, f"{msg.worker} exited (code {msg.exitcode}) while holding the request",
                               holder_dead=True)
        self.rings.forget(f"{shm.PREFIX}{self.cfg.instance}.{msg.worker}.")
        self.publish_snapshot(time.monotonic())
        if held:
            self.log.warning("%s died: answered %d requests UNAVAILABLE", msg.worker, len(held))

    def on_state(self, msg: m.ServiceState, ident: bytes) -> None:
        changed = msg.ready != self.ready
        self.ready = msg.ready
        self.started_ok = self.started_ok or msg.ready
        self.state = {"processes": msg.processes, "restarts": msg.restarts}
        if changed:
            self.publish_snapshot(time.monotonic())
        self.state = {"processes": msg.processes, "restarts": msg.restarts}

    def on_drain(self, msg: m.Drain, ident: bytes) -> None:
        self.log.info("draining: %d in flight, grace %.1fs", len(self.table), msg.grace_s)
        self.draining_until = time.monotonic() + msg.grace_s

    # -- ops ----------------------------------------------------------------
    def health(self, req_id: Any) -> dict:
        now = time.monotonic()
        alive = {n: w for n, w in self.workers.items() if now - w["seen"] <= WORKER_SILENCE_S}
        roles = {r: sum(1 for w in alive.values() if w["role"] == r) for r in ("preprocess", "executor", "postprocess")}
        ex = alive.get("executor", {}).get("info", {})
        providers = {k: v.get("provider") for k, v in ex.get("models", {}).items()}
        live = all(roles.values())
        # ready: started once, every role has a live worker (one of several restarting still
        # serves), not draining.  ``degraded`` says some process is down or restarting.
        return {"id": req_id, "ok": True, "live": live,
                "ready": bool(self.started_ok and live and self.draining_until is None),
                "degraded": not self.ready,
                "protocol": p.PROTOCOL_VERSION, "version": _version(), "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 3), "in_flight": len(self.table),
                "workers": roles, "providers": providers, "draining": self.draining_until is not None,
                "breakers": self.breakers.view(), "degradation": self.degrader.view(), "cache": self.cache.view() if self.cache.enabled else None,
                "processes": self.state["processes"], "restarts": self.state["restarts"],
                "counts": self.counts}

    def stats_view(self, req_id: Any, req: dict) -> dict:
        """Stage timings (for ``aieng report``), queue depths, counts; ``reset`` starts a new window."""
        since = req.get("since_s")
        since = float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) and since > 0 else None
        summary = self.stats.summary(since)
        depth: dict[str, int] = {}
        for r in self.table.items.values():
            depth[r.stage] = depth.get(r.stage, 0) + 1
        summary.update({"id": req_id, "ok": True, "in_flight": len(self.table), "queue_depth": depth,
                        "counts": self.counts, "restarts": self.state["restarts"]})
        if req.get("reset") is True:
            self.stats.reset()
        return summary

    def set_log_level(self, req_id: Any, level: Any) -> dict:
        """Admin op: change every process's log level at run time, no restart."""
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            return {"id": req_id, "ok": False,
                    "error": {"code": p.INVALID_REQUEST, "message": "level must be DEBUG, INFO, WARNING or ERROR"}}
        logging.getLogger().setLevel(level)
        msg = m.encode(m.LogLevel(level))
        told = []
        for name in list(self.workers) + ["supervisor"]:
            if self.send_hub_frames(name, [msg]):
                told.append(name)
        self.log.warning("log level set to %s (%s)", level, ", ".join(told))
        return {"id": req_id, "ok": True, "level": level, "processes": told}

    def models(self, req_id: Any) -> dict:
        ex = self.workers.get("executor", {}).get("info", {}).get("models", {})
        out = {}
        for name, versions in self.specs.items():
            out[name] = {"default_version": self.default_version[name],
                         "versions": {v: dict(s.public(), onnx=ex.get(s.key)) for v, s in versions.items()}}
        return {"id": req_id, "ok": True, "models": out}

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
        self.clients.close(linger=500)
        if self.auth is not None:
            self.auth.stop()
        self.hub.close(0)
        self.rings.close()


def _version() -> str:
    from aieng import __version__
    return __version__


def run_frontend_process(cfg_dict: dict, spec_dicts: dict, worker: str, ready_conn) -> None:
    cfg = Config.from_dict(cfg_dict)
    log = procutil.child_setup("frontend", worker, cfg_dict, ready_conn)
    stop = procutil.StopFlag()
    try:
        specs: dict[str, dict[str, ModelSpec]] = {}
        for d in spec_dicts.values():
            s = ModelSpec.from_dict(d)
            specs.setdefault(s.name, {})[s.version] = s
        fe = Frontend(cfg, specs, log)
    except Exception as exc:
        procutil.report_failure(ready_conn, log, exc)
        raise SystemExit(1)
    procutil.report_ready(ready_conn, {"addr": cfg.frontend_addr})
    try:
        fe.run(stop)
    finally:
        fe.close()
