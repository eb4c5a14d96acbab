"""The executor process: owns every ONNX Runtime session and runs batches.

One thread, one loop: drain ``InferTask`` messages from the hub, hand them to
the batcher, and when it says so assemble a padded batch straight from the
preprocess workers' shared-memory slots (freeing each slot as soon as its rows
are copied), run the session, and write each request's own rows into a slot
of this process's output ring.

Padding never changes a result: every variable input dimension carries a
symbolic name (e.g. ``sequence``); output dimensions with the same name are
cut back to the request's own size before they leave, so a request gets
exactly the rows it would have got alone.
"""
from __future__ import annotations

import os
import time

import numpy as np
import zmq

from aieng import messages as m
from aieng import model_repo, procutil, shm
from aieng.addresses import hub_addr
from aieng.config import Config
from aieng.gpu_executor.batcher import Batcher, Pending
from aieng.gpu_executor.sessions import ModelSession, describe_runtime
from aieng.model_repo import ModelSpec
from aieng.protocol import INTERNAL, INVALID_INPUT, UNAVAILABLE


class Executor:
    def __init__(self, cfg: Config, specs: dict[str, ModelSpec], log):
        self.cfg, self.log = cfg, log
        self.init_sessions(specs)
        self.init_batcher()
        self.init_rings()
        self.init_socket()

    def init_sessions(self, specs: dict[str, ModelSpec]) -> None:
        """One session per model, each built on its own: a model that fails (a corrupt file, a file
        changed on disk since the supervisor hashed it) is recorded in ``failed`` and answered
        UNAVAILABLE; the others serve.  Only a strict start fails the executor."""
        def load(spec: ModelSpec) -> ModelSession:
            t0 = time.perf_counter()
            model_repo.verify_content(spec)  # never load a file that changed under us
            sess = ModelSession(spec, self.cfg.device, self.cfg.intra_op_threads, self.cfg.ort_spinning)
            runs = sess.warmup()
            self.log.info("loaded %s (%s) on %s, %d warm-up runs in %.2fs", spec.key, spec.content_hash[:12],
                          sess.provider, runs, time.perf_counter() - t0)
            return sess

        self.sessions: dict[str, ModelSession]
        self.failed: dict[str, str]
        self.sessions, self.failed = model_repo.build_each(specs, load, self.log, self.cfg.strict_model_load,
                                                           path=lambda s: s.onnx_path)

    def init_batcher(self) -> None:
        self.batcher = Batcher()
        for key, sess in self.sessions.items():
            b = sess.spec.batching
            self.batcher.add_model(key, int(b["max_batch_size"]), float(b["max_wait_ms"]),
                                   float(b.get("max_padding_waste", 0.3)))
            for rows, length, seconds in sess.warm_costs:  # seed the cost model from warm-up runs
                self.batcher.observe(key, rows, length, seconds)

    def init_rings(self) -> None:
        self.inputs = shm.RingCache()
        name = shm.segment_name(self.cfg.instance, "executor", os.getpid())
        lease = 2 * self.cfg.max_timeout_ms / 1000 + 30
        need = max((s.max_output_bytes for s in self.sessions.values()), default=0)
        self.ring = shm.Ring.create(name, self.cfg.ring_slots, max(self.cfg.shm_slot_bytes, need), lease_s=lease)

    def init_socket(self) -> None:
        self.sock = procutil.hub_socket(zmq.Context.instance(), hub_addr(self.cfg.runtime_dir), "executor")

    def info(self) -> dict:
        return {"ring": self.ring.seg.name, "runtime": describe_runtime(),
                "models": {k: s.describe() for k, s in self.sessions.items()}, "failed": dict(self.failed)}

    # -- the loop -----------------------------------------------------------
    def maybe_hello(self) -> None:
        """Heartbeat to the frontend at most once a second (it stops routing to a silent worker)."""
        now = time.monotonic()
        if now >= self.next_hello:
            self.sock.send(self.hello)
            self.next_hello = now + 1.0

    def run(self, stop: procutil.StopFlag) -> None:
        self.hello = m.encode(m.Hello("executor", "executor", os.getpid(), self.info()))
        self.next_hello = 0.0
        timeout_ms = 200
        waiter = procutil.Waiter(self.sock)
        while not stop.stop:
            if waiter.wait(timeout_ms):
                self.drain()
            now = time.monotonic()
            for p in self.batcher.expire(now):
                self.release_input(p.payload.ref)  # the frontend answers TIMEOUT itself
            key, batch, wake_at = self.batcher.next_batch(now)
            if key is not None:
                self.run_batch(key, batch)
                timeout_ms = 0  # look again at once: more may be ready
            elif wake_at is not None:
                timeout_ms = max(0, int((wake_at - now) * 1000) + 1)
            else:
                timeout_ms = 200
            self.maybe_hello()

    def drain(self) -> None:
        while True:
            try:
                data = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            task = m.decode(data.buffer)
            if isinstance(task, m.InferTask):
                self.accept(task)
            elif isinstance(task, m.LogLevel):
                procutil.set_level(task.level)
            else:
                self.log.warning("unexpected message %s", type(task).__name__)

    def accept(self, task: m.InferTask) -> None:
        key = f"{task.model}:{task.version}"
        sess = self.sessions.get(key)
        if sess is None:  # a model that failed to load is unavailable, not an internal error
            if key in self.failed:
                self.fail(task.rid, UNAVAILABLE, self.failed[key], task.ref)
            else:
                self.fail(task.rid, INTERNAL, f"executor does not serve {key}", task.ref)
            return
        problem = self.check_shapes(sess, task.ref[3])
        if problem:
            self.fail(task.rid, INVALID_INPUT, problem, task.ref)
            return
        self.batcher.put(key, Pending(task.rid, task.seq_len, time.monotonic(), task.deadline, task), task.upstream)

    @staticmethod
    def check_shapes(sess: ModelSession, descs: list) -> str | None:
        got = {d[0]: d for d in descs}
        for spec in sess.inputs:
            d = got.get(spec.name)
            if d is None:
                return f"model input '{spec.name}' was not provided"
            if np.dtype(d[1]) != spec.dtype:
                return f"input '{spec.name}' must be {spec.dtype.name}, got {np.dtype(d[1]).name}"
            shape = d[2]
            if len(shape) != len(spec.dims):
                return f"input '{spec.name}' must have {len(spec.dims)} dims per request, got {len(shape)}"
            for have, want in zip(shape, spec.dims):
                if isinstance(want, int) and want >= 0 and have != want:
                    return f"input '{spec.name}' must have shape {spec.dims}, got {shape}"
                if have == 0:
                    return f"input '{spec.name}' has an empty dimension"
        return None

    def run_batch(self, key: str, batch: list[Pending]) -> None:
        sess = self.sessions[key]
        started = time.monotonic()
        feeds, sizes, live = self.assemble(sess, batch)
        if not live:
            return
        t0 = time.perf_counter_ns()
        try:
            outputs = sess.run(feeds)
        except Exception as exc:  # a failing run fails its batch, not the executor
            self.log.exception("%s: run failed", key)
            for p in live:
                self.fail(p.rid, INTERNAL, f"model run failed: {type(exc).__name__}")
            return
        infer_us = (time.perf_counter_ns() - t0) // 1000
        padded = max((max(s.values(), default=0) for s in sizes), default=0)
        self.batcher.observe(key, len(live), padded, infer_us / 1e6)
        for row, p in enumerate(live):
            self.publish(sess, p, row, outputs, sizes[row], len(live), padded,
                         int((started - p.arrived) * 1e6), infer_us)

    def assemble(self, sess: ModelSession, batch: list[Pending]):
        """Copy each request's tensors into padded batch arrays; free input slots."""
        views, live, sizes = [], [], []
        for p in batch:
            seg, slot, gen, descs = p.payload.ref
            try:
                ring = self.inputs.get(seg)
            except (FileNotFoundError, ValueError):
                self.fail(p.rid, UNAVAILABLE, "preprocess worker went away before inference")
                continue
            views.append((ring, slot, gen, ring.views(slot, descs)))
            live.append(p)
        feeds, sizes = sess.feeds_from([v[3] for v in views]) if views else ({}, [])
        for ring, slot, gen, _ in views:
            ring.free(slot, gen)  # the rows are copied into the batch: the slot may be reused
        return feeds, sizes, live

    def publish(self, sess, p: Pending, row: int, outputs, size: dict, rows: int, padded: int,
                wait_us: int, infer_us: int) -> None:
        tensors = sess.request_outputs(outputs, row, size)
        slot = self.ring.alloc()
        while slot is None:  # postprocess is behind: wait for a slot (backpressure)
            if time.monotonic() > p.deadline:
                return  # the frontend has answered TIMEOUT
            time.sleep(0.0005)
            self.maybe_hello()
            slot = self.ring.alloc()
        try:
            descs = self.ring.write(slot[0], tensors)
        except OverflowError as exc:
            self.ring.free(*slot)
            self.fail(p.rid, INTERNAL, f"{exc}; raise AIENG_SHM_SLOT_BYTES")
            return
        ref = [self.ring.seg.name, slot[0], slot[1], descs]
        self.log.debug("inferred in a batch of %d (padded %d, %d us)", rows, padded, infer_us,
                       extra={"trace": p.payload.trace})
        self.sock.send(m.encode(m.Inferred(p.rid, ref, rows, padded, wait_us, infer_us)))

    def release_input(self, ref: list) -> None:
        self.inputs.free(ref[0], ref[1], ref[2])

    def fail(self, rid: int, code: str, message: str, ref: list | None = None) -> None:
        if ref is not None:
            self.release_input(ref)
        self.sock.send(m.encode(m.Failed(rid, code, message)))

    def close(self) -> None:
        self.sock.close(0)
        self.inputs.close()
        self.ring.close()
        self.ring.seg.unlink()


def run_executor_process(cfg_dict: dict, spec_dicts: dict, worker: str, ready_conn) -> None:
    cfg = Config.from_dict(cfg_dict)
    log = procutil.child_setup("executor", worker, cfg_dict, ready_conn)
    stop = procutil.StopFlag()
    try:
        specs = {k: ModelSpec.from_dict(v) for k, v in spec_dicts.items()}
        ex = Executor(cfg, specs, log)
    except Exception as exc:
        procutil.report_failure(ready_conn, log, exc)
        raise SystemExit(1)
    procutil.report_ready(ready_conn, ex.info())
    try:
        ex.run(stop)
    finally:
        ex.close()
