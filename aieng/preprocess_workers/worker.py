"""The preprocess worker process: ``PreTask`` in; ``InferTask`` to the executor,
``Preprocessed``/``Failed`` out.

Receives the client's raw request frame from the frontend, validates the
inputs against the model's declared inputs, turns them into tensors with the
model's processor, writes them into a slot of this worker's own shared-memory
ring and sends the slot descriptor straight to the executor (``InferTask``, on its lane),
telling the frontend with one ``Preprocessed`` notice per drain.  Requests that pile
up while it works are drained together so text models can batch-encode; a request
alone in the server (``PreTask.alone``, the frontend's idle rule) may use every core
(an image's OpenCV threads), any other one core; if that model's last lone request took this worker at most
``SOON_WORK_S``, the executor is told it comes (``HubWorker.soon``) as the worker starts on it.
A request whose content it cannot handle fails alone; the worker never dies
of one request, but one it cannot finish within AIENG_PREPROCESS_BUDGET_MS has it
replaced (the frontend reads its silence between heartbeats, sent between requests).
A pipeline's crop request (``PreTask.crop``, only the frontend sets it) carries the
page: the image processor cuts the box out of it first.
"""
from __future__ import annotations

import os
import time
from typing import Any

from aieng.config import Config
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.processing.pre.processors import PROCESSORS, spread
from aieng.processing.pre.request import read_request
from aieng.processing.usercode import forget, log_failure
from aieng.runtime.specbook import SpecBook
from aieng.runtime.worker import SOON_WORK_S, HubWorker, own_ring, push_socket
from aieng.runtime.worker_hotswap import Versions
from aieng.wire import messages as m
from aieng.wire.addresses import exec_addr
from aieng.wire.protocol import (
    INTERNAL,
    INVALID_INPUT,
    INVALID_REQUEST,
    UNAVAILABLE,
    RequestError,
)

MAX_DRAIN = 64


class PreprocessWorker(HubWorker):
    role = "preprocess"

    def __init__(self, cfg: Config, specs: SpecBook, worker: str, log):
        super().__init__(cfg, worker, log)
        self.init_processors(specs)
        self.init_ring()
        self.to_exec = push_socket(exec_addr(cfg.runtime_dir))
        self.notice = m.Preprocessed([], [])
        self.handlers[m.PreTask] = self.on_task
        self.arrived: list[tuple[m.PreTask, Any]] = []  # drained together, encoded together
        self.alone_s: dict[str, float] = {}  # version -> how long its last lone request took here
        self.cores = len(os.sched_getaffinity(0))  # a request alone in the server may use them all
        self.init_hotswap()

    def init_processors(self, specs: SpecBook) -> None:
        """Each model's processor on its own: one that fails (e.g. a corrupt tokenizer file) is
        recorded in ``failed`` and its requests get UNAVAILABLE; the other models serve.  Each spec stays
        packed until a request of its model reads it (``SpecBook``)."""
        self.specs = specs
        self.frames: dict[int, bytes] = {}  # rid -> its request frame, within one drain (InferTask.request)
        self.procs, self.failed = model_repo.build_each(specs, lambda s: PROCESSORS[s.preprocess.type](s),
                                                        self.log, self.cfg.strict_model_load)

    def init_hotswap(self) -> None:
        """Run-time load/unload of a version (worker_hotswap): its processor, built between drains."""
        def check(key: str, proc) -> None:
            need = getattr(proc, "max_request_bytes", 0)
            if need > self.ring.slot_bytes:
                raise ValueError(f"its requests need {need} bytes, over this worker's {self.ring.slot_bytes}-"
                                 f"byte ring slots, sized at start for the versions built then: set "
                                 f"AIENG_SHM_SLOT_BYTES >= {need}, or serve it from the start (not lazy)")

        def build(spec: ModelSpec, urgent: bool):
            return PROCESSORS[spec.preprocess.type](spec)

        self.versions = Versions(self.worker, self.send, self.refresh_hello, self.log, self.procs,
                                 self.failed, build, check=check,
                                 on_add=lambda spec, _: self.specs.__setitem__(spec.key, spec),
                                 on_remove=self.forget, defer=True)
        self.handlers.update(self.versions.handlers)

    def forget(self, key: str) -> None:
        self.alone_s.pop(key, None)
        spec = self.specs.pop(key, None)
        if spec is not None and spec.preprocess.type == "python":
            forget(spec)  # its code's modules: a later load of that directory imports afresh

    def init_ring(self) -> None:
        needs = [getattr(p, "max_request_bytes", 0) for p in self.procs.values()]
        # small slots beside big ones when some model's requests are small (textrec's crops beside
        # textdet's pages): pages then never hold every slot a crop could use (shmsize.ring_shape)
        self.ring = own_ring(self.cfg, self.worker, max(needs, default=0),
                             small_requests=any(n <= self.cfg.shm_slot_bytes for n in needs))

    def hello_fields(self) -> dict:
        return {"ring": self.ring.seg.name, "failed": dict(self.failed)}

    # -- the loop ---------------------------------------------------------------
    def on_task(self, task: m.PreTask, frames: list) -> None:
        self.arrived.append((task, frames[1]))
        if task.alone:  # quick here before: the executor waits awake for it (HubWorker.soon)
            key = f"{task.model}:{task.version}"
            if self.alone_s.get(key, SOON_WORK_S) < SOON_WORK_S:
                self.soon("executor", key, task.post)

    def after_drain(self, now: float) -> None:
        for start in range(0, len(self.arrived), MAX_DRAIN):
            self.handle(self.arrived[start:start + MAX_DRAIN])
        self.arrived.clear()
        self.versions.build_deferred()  # a run-time load after the tasks that came with it

    def handle(self, arrived: list) -> None:
        started = time.monotonic()
        jobs = []  # (task, spec key, inputs, params) that passed validation
        for task, body in arrived:
            key = f"{task.model}:{task.version}"
            try:
                if key in self.failed:
                    raise RequestError(UNAVAILABLE, self.failed[key])
                if key not in self.procs:
                    raise RequestError(INTERNAL, f"this worker does not serve {key}")
                inputs, params = read_request(self.specs[key], body.buffer, self.cfg.max_message_bytes)
                jobs.append((task, key, inputs, params))
                if self.specs[key].postprocess.user_code:  # its post(outputs, inputs) gets the inputs
                    self.frames[task.rid] = bytes(body.buffer)
            except RequestError as exc:
                self.fail(task.rid, exc.code, exc.message)
            except Exception as exc:  # the frontend parsed this body already; never die of one request
                self.fail(task.rid, INVALID_REQUEST, f"request body could not be read: {type(exc).__name__}")
        by_model: dict[str, list] = {}
        for job in jobs:
            by_model.setdefault(job[1], []).append(job)
        for key, group in by_model.items():
            self.run_group(self.procs[key], group, started)
        self.frames.clear()  # forwarded or failed by now
        if self.notice.rids:  # one notice for the whole drain: these slots are the executor's now
            self.send(self.notice)
            self.notice = m.Preprocessed([], [])

    def run_group(self, proc, group: list, started: float) -> None:
        if getattr(proc, "batchable", False):  # one call encodes the whole group (a tokenizer's batch)
            checked = []
            for task, _, inputs, params in group:
                try:
                    checked.append(((task, params), proc.check(inputs)))
                except RequestError as exc:
                    self.fail(task.rid, exc.code, exc.message)
            if not checked:
                return
            try:
                outs = proc.process_many([c[1] for c in checked])
            except Exception as exc:  # a processor bug fails its requests, not the worker
                self.log.exception("batched preprocess failed")
                for (task, _), _ in checked:
                    self.fail(task.rid, INTERNAL, f"preprocessing failed: {type(exc).__name__}")
                return
            for ((task, params), _), out in zip(checked, outs):
                if isinstance(out, RequestError):  # that request alone (a hook's: usercode)
                    log_failure(self.log, out, task.rid, task.trace)
                    self.fail(task.rid, out.code, out.message)
                else:
                    self.forward(task, params, *out, started)
            return
        # One at a time (an image: milliseconds each), each sent on as soon as it is ready, its trail
        # starting when its own work does: the wait behind the drain's earlier requests shows as its
        # preprocess queue, not as its preprocessing (at orientation c=32 the step read 101 ms for 6 ms
        # of work when the whole drain went on at its end), and the executor can start on the first.
        for task, _, inputs, params in group:
            # between two requests (at most once a second): the frontend reads our silence while we hold
            # requests as the time spent on one, and has a worker stuck past the budget replaced
            self.heartbeat()
            spread(proc, task.alone, self.cores)  # an image's OpenCV threads: every core when alone
            own_start = time.monotonic()
            try:
                if task.crop is not None:  # a pipeline's crop step: the input is the whole page
                    out = proc.process_crop(inputs, task.crop, task.page)
                else:
                    out = proc.process(inputs)
            except RequestError as exc:
                log_failure(self.log, exc, task.rid, task.trace)  # a hook's traceback (usercode)
                self.fail(task.rid, exc.code, exc.message)
                continue
            except Exception as exc:  # a processor bug fails its request, not the worker
                self.log.exception("preprocess failed for rid %s", task.rid)
                self.fail(task.rid, INTERNAL, f"preprocessing failed: {type(exc).__name__}")
                continue
            self.forward(task, params, *out, own_start, getattr(out, "geometry", None))

    def forward(self, task: m.PreTask, params: dict, tensors, seq_len: int, info: dict,
                started: float, geometry: m.Geometry | None = None) -> None:
        """Write the tensors into our ring and send the descriptor straight to the executor."""
        try:
            ref = self.publish(self.ring, tensors, task.deadline, INVALID_INPUT)
        except RequestError as exc:
            self.fail(task.rid, exc.code, exc.message)
            return
        trail = m.Trail(pre_started=started, pre_sent=time.monotonic(), seq_len=seq_len)
        if task.alone:
            self.alone_s[f"{task.model}:{task.version}"] = trail.pre_sent - started
        data = m.encode(m.InferTask(task.rid, task.model, task.version, task.deadline, ref, seq_len,
                                    task.upstream, task.post, params, task.degraded, task.trace, trail,
                                    geometry, task.background, task.alone, info,
                                    self.frames.pop(task.rid, None), task.epoch))
        if not self.outbound.send("executor", data):  # the lane when it can (wire/lanes), else ZeroMQ
            self.to_exec.send(data)
        self.notice.rids.append(task.rid)
        self.notice.refs.append(ref.place())
        self.log.debug("preprocessed %s:%s into slot %d", task.model, task.version, ref.slot,
                       extra={"trace": task.trace})

    def close(self) -> None:
        self.to_exec.close(0)
        super().close()
        self.ring.close()
        self.ring.seg.unlink()
