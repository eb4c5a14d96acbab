"""The preprocess worker process: ``PreTask`` in, ``Preprocessed``/``Failed`` out.

Receives the client's raw request frame from the frontend, validates the
inputs against the model's declared inputs, turns them into tensors with the
model's processor, writes them into a slot of this worker's own shared-memory
ring and sends the slot descriptor back to the frontend.  Requests that pile
up while it works are drained together so text models can batch-encode.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any

import zmq

from aieng import messages as m
from aieng import model_repo, procutil, shm
from aieng.addresses import hub_addr
from aieng.config import Config
from aieng.model_repo import ModelSpec
from aieng.preprocess_workers import PROCESSORS
from aieng.protocol import INTERNAL, INVALID_INPUT, TIMEOUT, UNAVAILABLE, RequestError, unpack_limited

_KIND_CHECKS = {
    "text": lambda v: isinstance(v, str),
    "image": lambda v: isinstance(v, (bytes, bytearray)),
    "number": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
    "category": lambda v: v is None or isinstance(v, str),
    "tensor": lambda v: isinstance(v, dict),
}
MAX_DRAIN = 64


def validate_inputs(spec: ModelSpec, inputs: Any) -> dict[str, Any]:
    if not isinstance(inputs, dict):
        raise RequestError(INVALID_INPUT, "'inputs' must be a map")
    declared = {i["name"]: i for i in spec.inputs}
    for name, value in inputs.items():
        decl = declared.get(name)
        if decl is None:
            raise RequestError(INVALID_INPUT, f"model '{spec.name}' has no input {name!r}; "
                                              f"it takes {', '.join(declared)}")
        if not _KIND_CHECKS[decl["kind"]](value):
            raise RequestError(INVALID_INPUT, f"input '{name}' must be of kind {decl['kind']}, "
                                              f"got {type(value).__name__}")
        if isinstance(value, float) and math.isinf(value):
            raise RequestError(INVALID_INPUT, f"input '{name}' is infinite")
    for name, decl in declared.items():
        if not decl.get("optional", False) and name not in inputs:
            raise RequestError(INVALID_INPUT, f"missing input '{name}'")
    return inputs


class PreprocessWorker:
    def __init__(self, cfg: Config, specs: dict[str, ModelSpec], worker: str, log):
        self.cfg, self.worker, self.log = cfg, worker, log
        self.init_processors(specs)
        self.init_ring()
        self.init_socket()

    def init_processors(self, specs: dict[str, ModelSpec]) -> None:
        """Each model's processor on its own: one that fails (e.g. a corrupt tokenizer file) is
        recorded in ``failed`` and its requests get UNAVAILABLE; the other models serve."""
        self.specs = specs
        self.procs, self.failed = model_repo.build_each(specs, lambda s: PROCESSORS[s.preprocess["type"]](s),
                                                        self.log, self.cfg.strict_model_load)

    def init_ring(self) -> None:
        name = shm.segment_name(self.cfg.instance, self.worker, os.getpid())
        lease = 2 * self.cfg.max_timeout_ms / 1000 + 30
        need = max((getattr(p, "max_request_bytes", 0) for p in self.procs.values()), default=0)
        self.ring = shm.Ring.create(name, self.cfg.ring_slots, max(self.cfg.shm_slot_bytes, need), lease_s=lease)

    def init_socket(self) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = procutil.hub_socket(self.ctx, hub_addr(self.cfg.runtime_dir), self.worker)

    def hello(self) -> None:
        self.sock.send(m.encode(m.Hello(self.worker, "preprocess", os.getpid(),
                                      {"ring": self.ring.seg.name, "failed": self.failed})))
        self.next_hello = time.monotonic() + 1.0

    def maybe_hello(self) -> None:
        if time.monotonic() >= self.next_hello:
            self.hello()

    # -- the loop -----------------------------------------------------------
    def run(self, stop: procutil.StopFlag) -> None:
        self.hello()
        waiter = procutil.Waiter(self.sock)
        while not stop.stop:
            if waiter.wait(200):
                batch = []
                while len(batch) < MAX_DRAIN:
                    try:
                        batch.append(self.sock.recv_multipart(zmq.NOBLOCK, copy=False))
                    except zmq.Again:
                        break
                self.handle(batch)
            self.maybe_hello()  # heartbeat: the frontend learns we are alive (also after it restarts)

    def handle(self, frames_list: list) -> None:
        jobs = []  # (task, spec key, inputs) that passed validation
        for frames in frames_list:
            task = m.decode(frames[0].buffer)
            if isinstance(task, m.LogLevel):
                procutil.set_level(task.level)
                continue
            if not isinstance(task, m.PreTask):
                self.log.warning("unexpected message %s", type(task).__name__)
                continue
            key = f"{task.model}:{task.version}"
            try:
                if key in self.failed:
                    raise RequestError(UNAVAILABLE, self.failed[key])
                if key not in self.procs:
                    raise RequestError(INTERNAL, f"this worker does not serve {key}")
                body = unpack_limited(frames[1].buffer, self.cfg.max_message_bytes)
                inputs = validate_inputs(self.specs[key], body.get("inputs"))
                jobs.append((task, key, inputs))
            except RequestError as exc:
                self.fail(task.rid, exc.code, exc.message)
        by_model: dict[str, list] = {}
        for job in jobs:
            by_model.setdefault(job[1], []).append(job)
        for key, group in by_model.items():
            self.run_group(self.procs[key], group)

    def run_group(self, proc, group: list) -> None:
        t0 = time.perf_counter_ns()
        results: list = []
        if getattr(proc, "batchable", False):
            checked = []
            for task, _, inputs in group:
                try:
                    checked.append((task, proc.check(inputs)))
                except RequestError as exc:
                    self.fail(task.rid, exc.code, exc.message)
            if checked:
                try:
                    outs = proc.process_many([c[1] for c in checked])
                    results = [(task, out) for (task, _), out in zip(checked, outs)]
                except Exception as exc:  # a processor bug fails its requests, not the worker
                    self.log.exception("batched preprocess failed")
                    for task, _ in checked:
                        self.fail(task.rid, INTERNAL, f"preprocessing failed: {type(exc).__name__}")
        else:
            for task, _, inputs in group:
                try:
                    results.append((task, proc.process(inputs)))
                except RequestError as exc:
                    self.fail(task.rid, exc.code, exc.message)
                except Exception as exc:  # a processor bug fails its request, not the worker
                    self.log.exception("preprocess failed for rid %s", task.rid)
                    self.fail(task.rid, INTERNAL, f"preprocessing failed: {type(exc).__name__}")
        per_us = (time.perf_counter_ns() - t0) // 1000 // max(1, len(group))
        for task, (tensors, seq_len, info) in results:
            self.publish(task, tensors, seq_len, info, per_us)

    def publish(self, task: m.PreTask, tensors, seq_len: int, info: dict, pre_us: int) -> None:
        slot = self.ring.alloc()
        while slot is None:  # ring full: backpressure until a consumer frees a slot
            if time.monotonic() > task.deadline:
                self.fail(task.rid, TIMEOUT, "deadline passed waiting for a shared-memory slot")
                return
            time.sleep(0.0005)
            self.maybe_hello()
            slot = self.ring.alloc()
        try:
            descs = self.ring.write(slot[0], tensors)
        except OverflowError as exc:
            self.ring.free(*slot)
            self.fail(task.rid, INVALID_INPUT, f"{exc}; raise AIENG_SHM_SLOT_BYTES")
            return
        ref = [self.ring.seg.name, slot[0], slot[1], descs]
        self.log.debug("preprocessed %s:%s into slot %d (%d us)", task.model, task.version, slot[0], pre_us,
                       extra={"trace": task.trace})
        self.sock.send(m.encode(m.Preprocessed(task.rid, ref, seq_len, pre_us, info)))

    def fail(self, rid: int, code: str, message: str) -> None:
        self.sock.send(m.encode(m.Failed(rid, code, message)))

    def close(self) -> None:
        self.sock.close(0)
        self.ring.close()
        self.ring.seg.unlink()


def run_preprocess_process(cfg_dict: dict, spec_dicts: dict, worker: str, ready_conn) -> None:
    cfg = Config.from_dict(cfg_dict)
    log = procutil.child_setup("preprocess", worker, cfg_dict, ready_conn)
    stop = procutil.StopFlag()
    try:
        specs = {k: ModelSpec.from_dict(v) for k, v in spec_dicts.items()}
        w = PreprocessWorker(cfg, specs, worker, log)
    except Exception as exc:
        procutil.report_failure(ready_conn, log, exc)
        raise SystemExit(1)
    procutil.report_ready(ready_conn, {"ring": w.ring.seg.name})
    try:
        w.run(stop)
    finally:
        w.close()
