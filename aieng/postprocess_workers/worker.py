"""The postprocess worker process: ``PostTask`` in, ``Result``/``Failed`` out.

Reads the request's outputs in place from the executor's ring, computes the
answer with the model's op, frees the slot, and sends the outputs back to the
frontend already msgpack-packed so the frontend only splices them in.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import zmq

from aieng import messages as m
from aieng import model_repo, procutil, shm
from aieng.addresses import hub_addr
from aieng.config import Config
from aieng.model_repo import ModelSpec
from aieng.postprocess_workers.ops import OPS
from aieng.protocol import INTERNAL, UNAVAILABLE, RequestError, encode_tensor, pack


def to_wire(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return encode_tensor(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


class PostprocessWorker:
    def __init__(self, cfg: Config, specs: dict[str, ModelSpec], worker: str, log):
        self.cfg, self.worker, self.log = cfg, worker, log
        # Each model's op on its own: one that fails (e.g. labels read from a corrupt model file)
        # is recorded in ``failed`` and its requests get UNAVAILABLE; the other models serve.
        self.ops, self.failed = model_repo.build_each(specs, lambda s: OPS[s.postprocess["type"]](s),
                                                      log, cfg.strict_model_load)
        self.rings = shm.RingCache()
        self.sock = procutil.hub_socket(zmq.Context.instance(), hub_addr(cfg.runtime_dir), worker)

    def run(self, stop: procutil.StopFlag) -> None:
        hello = m.encode(m.Hello(self.worker, "postprocess", os.getpid(), {"failed": self.failed}))
        self.sock.send(hello)
        next_hello = time.monotonic() + 1.0
        waiter = procutil.Waiter(self.sock)
        while not stop.stop:
            if waiter.wait(200):
                while True:
                    try:
                        data = self.sock.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    task = m.decode(data.buffer)
                    if isinstance(task, m.PostTask):
                        self.handle(task)
                    elif isinstance(task, m.LogLevel):
                        procutil.set_level(task.level)
            if time.monotonic() >= next_hello:
                self.sock.send(hello)
                next_hello = time.monotonic() + 1.0

    def handle(self, task: m.PostTask) -> None:
        t0 = time.perf_counter_ns()
        seg, slot, gen, descs = task.ref
        try:
            ring = self.rings.get(seg)
        except (FileNotFoundError, ValueError):
            self.sock.send(m.encode(m.Failed(task.rid, UNAVAILABLE, "executor went away before postprocessing")))
            return
        try:
            op = self.op(f"{task.model}:{task.version}")
            result = op(ring.views(slot, descs), task.params or {})
            confidence = op.confidence(result) if hasattr(op, "confidence") else None
            packed = pack({k: to_wire(v) for k, v in result.items()})
        except RequestError as exc:
            self.sock.send(m.encode(m.Failed(task.rid, exc.code, exc.message)))
            return
        except Exception as exc:
            self.log.exception("postprocess failed for rid %s", task.rid)
            self.sock.send(m.encode(m.Failed(task.rid, INTERNAL, f"postprocessing failed: {type(exc).__name__}")))
            return
        finally:
            ring.free(slot, gen)  # results are copies now; the slot may be reused
        post_us = (time.perf_counter_ns() - t0) // 1000
        self.log.debug("postprocessed %s:%s (%d us)", task.model, task.version, post_us, extra={"trace": task.trace})
        self.sock.send(m.encode(m.Result(task.rid, packed, post_us, confidence)))

    def op(self, key: str):
        if key in self.failed:
            raise RequestError(UNAVAILABLE, self.failed[key])
        return self.ops[key]

    def close(self) -> None:
        self.sock.close(0)
        self.rings.close()


def run_postprocess_process(cfg_dict: dict, spec_dicts: dict, worker: str, ready_conn) -> None:
    cfg = Config.from_dict(cfg_dict)
    log = procutil.child_setup("postprocess", worker, cfg_dict, ready_conn)
    stop = procutil.StopFlag()
    try:
        specs = {k: ModelSpec.from_dict(v) for k, v in spec_dicts.items()}
        w = PostprocessWorker(cfg, specs, worker, log)
    except Exception as exc:
        procutil.report_failure(ready_conn, log, exc)
        raise SystemExit(1)
    procutil.report_ready(ready_conn)
    try:
        w.run(stop)
    finally:
        w.close()
