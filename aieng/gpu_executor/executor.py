"""The executor process: owns every ONNX Runtime session and runs batches.

One loop (the shared ``HubWorker`` runtime) and a few lanes (``lanes``): the loop drains the
``InferTask`` messages preprocess workers push to its inbox into the batcher (internal verification
tasks, ``InferTask.background``, into ``bg_batcher`` for the background lane), and while a lane is free
and the batcher says so, assembles a padded batch straight from the preprocess workers' shared-memory
slots (freeing each slot as soon as its rows are copied) and gives the run to a lane (a lone batch whose run
is quick runs in the loop: ``on_soon`` tells its postprocess worker ahead).  A finished run's
answers go out through ``outputs``.  Its parts, each given what it needs: ``builder`` (sessions and the
idle-time wide ones), ``direct`` (the frontend's direct requests, preprocessed here), ``outputs`` (a
batch's answers), ``worker_hotswap.Versions`` (run-time loads).  All socket and ring work stays on the
loop thread.  Padding never changes a result: docs/architecture.md, 'Padding and the cut rule'.
"""
from __future__ import annotations

import os
import time

from aieng.config import Config
from aieng.gpu_executor.batcher import Batcher, Pending
from aieng.gpu_executor.builder import WIDE_MAX_ROWS, SessionBuilder
from aieng.gpu_executor.direct import DirectRequests
from aieng.gpu_executor.inline_post import EXECUTOR, InlinePost
from aieng.gpu_executor.inline_pre import InlinePre
from aieng.gpu_executor.lanes import Job, Lanes
from aieng.gpu_executor.outputs import Outputs
from aieng.gpu_executor.sessions import ModelSession, gpu_count
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.runtime import procutil
from aieng.runtime.worker import HubWorker, own_ring
from aieng.runtime.worker_hotswap import Versions, lower_priority
from aieng.wire import messages as m
from aieng.wire import shm
from aieng.wire.addresses import exec_addr, express_path
from aieng.wire.protocol import INTERNAL, INVALID_INPUT, UNAVAILABLE

QUICK_RUN_S = 0.0005  # a lone batch whose run takes at most this long runs in the loop, not on a lane
# What a batch answered by the postprocess pool costs besides its run: its PostBatch and notice, and a
# postprocess worker woken with cold caches (0.1-0.2 ms of CPU on 2 shared cores; architecture.md 'Batching')
HANDOFF_S = 0.0002


class Executor(HubWorker):
    role = "executor"

    def __init__(self, cfg: Config, specs: dict[str, ModelSpec], worker: str, log):
        super().__init__(cfg, worker, log)
        self.start_policy = os.sched_getscheduler(0)  # the process's, before the loop's (``run``)
        self.init_sessions(specs)
        self.init_batcher()
        self.init_rings()
        self.init_lanes()
        self.init_hotswap()
        self.bind_inbox(exec_addr(cfg.runtime_dir))  # preprocess workers push InferTasks here
        self.outputs = Outputs(cfg, self.ring, self.publish, self.inline, self.send, self.fail,
                               self.outbound, log)
        self.init_direct()

    def run(self, stop) -> None:
        """The loop, its thread alone under SCHED_BATCH (``worker_sched_batch``, ``procutil.place``): woken by
        every message, it waits for the running thread's slice instead of preempting the frontend.  The
        lanes' and ONNX Runtime's threads, made before it, keep the process's policy, and so does a run-time
        load's thread (``build_in_background``): they run models."""
        if self.cfg.worker_sched_batch:
            refused = procutil.thread_policy(os.SCHED_BATCH)
            if refused:
                self.log.warning("%s; the executor's loop runs under the default policy", refused)
        super().run(stop)

    def init_sessions(self, specs: dict[str, ModelSpec]) -> None:
        """One session per model, each built on its own: a model that fails (a corrupt file, a file
        changed on disk since the supervisor hashed it) is recorded in ``failed`` and answered
        UNAVAILABLE; the others serve.  Only a strict start fails the executor."""
        self.sessions: dict[str, ModelSession]
        self.failed: dict[str, str]
        self.inline = InlinePost(self.cfg.inline_postprocess_us)  # cheap chains run here (inline_post)
        self.inline_pre = InlinePre(self.cfg.inline_preprocess_bytes, self.cfg.max_message_bytes,
                                    self.cfg.inline_image_pixels)
        self.builder = SessionBuilder(self.cfg, self.log, self.inline, self.inline_pre)
        self.sessions, self.failed = model_repo.build_each(
            specs, self.builder.build, self.log, self.cfg.strict_model_load, path=lambda s: s.onnx_path)

    def init_direct(self) -> None:
        """The frontend's direct requests come on the express lane or, while it is down, on the hub;
        each answer goes back the way its request came (``send``)."""
        self.direct = DirectRequests(express_path(self.cfg.runtime_dir), self.inline_pre, self.inline,
                                     self.accept, self.fail, self.log)
        self.wake_fds.append(self.direct.fileno())
        self.handlers[m.InferTask] = self.on_infer
        self.handlers[m.PreTask] = lambda task, frames: self.direct.on_task(task, frames[1].buffer)

    def send(self, msg) -> None:
        if not self.direct.reply(msg):
            super().send(msg)

    # -- run-time load/unload (worker_hotswap.Versions; the frontend drains before an unload) ------
    def init_hotswap(self) -> None:
        # A run-time load builds on a thread, warms up paced and has no wide session: it competes
        # with serving for the cores.
        self.versions = Versions(self.worker, self.send, self.refresh_hello, self.log, self.sessions,
                                 self.failed, self.build_in_background, background=True,
                                 check=self.check_loaded, on_add=self.add_version,
                                 on_remove=self.remove_version, gpu=True)
        self.handlers.update(self.versions.handlers)

    def build_in_background(self, spec: ModelSpec, urgent: bool) -> ModelSession:
        """A run-time load: on its own thread, no wide session; a cold load (``urgent``: a request waits)
        at the loop's priority with its warm-up unpaced, any other beside serving, politely."""
        if self.cfg.worker_sched_batch:  # made by the loop thread: its session's threads run models
            procutil.thread_policy(self.start_policy)
        return self.builder.build(spec, wide=False, background=True, urgent=urgent)

    def check_loaded(self, key: str, sess: ModelSession) -> None:
        if sess.max_output_bytes > self.ring.slot_bytes:
            need, have = sess.max_output_bytes, self.ring.slot_bytes
            raise ValueError(f"its outputs need {need} bytes per request, over the executor ring's "
                             f"{have}-byte slots, sized at start for the versions built then: set "
                             f"AIENG_SHM_SLOT_BYTES >= {need}, or serve it from the start (not lazy)")

    def add_version(self, spec: ModelSpec, sess: ModelSession) -> None:
        """A built version starts serving (on the loop thread): its batcher queues and where its
        postprocessing runs."""
        self.add_to_batcher(spec, sess)
        self.inline.adopt(spec.key)
        self.inline_pre.adopt(spec.key)
        if not self.inline.answers(spec.key):  # answered by the postprocess pool: a hand-off per batch
            for batcher in (self.batcher, self.bg_batcher):
                batcher.batch_cost(spec.key, HANDOFF_S)

    def add_to_batcher(self, spec: ModelSpec, sess: ModelSession) -> None:
        b = spec.batching
        for batcher in (self.batcher, self.bg_batcher):
            batcher.add_model(spec.key, sess.max_rows(), float(b.max_wait_ms),
                              float(b.max_padding_waste))
            for rows, length, seconds in sess.warm_costs:  # seed the cost model from warm-up runs
                batcher.observe(spec.key, rows, length, seconds)

    def remove_version(self, key: str) -> None:
        self.builder.drop(key)
        self.inline.drop(key)
        self.inline_pre.drop(key)
        self.bg_runs.pop(key, None)
        self.spare_runs.pop(key, None)
        for batcher in (self.batcher, self.bg_batcher):
            # The frontend drained the version first, but not all it sent may be gone from here: a shadow
            # copy (its drain leaves them out) or a request it answered TIMEOUT before our ``expire``.  Their
            # input slots are ours: freed now, not at the ring's lease.
            q = batcher.queues.pop(key, None)
            for p in q.items if q is not None else ():
                self.drop(p)

    def init_batcher(self) -> None:
        self.batcher, self.bg_batcher = Batcher(), Batcher()  # serving; internal (background lane)
        for key, sess in self.sessions.items():
            self.add_version(sess.spec, sess)

    def init_rings(self) -> None:
        self.inputs = shm.RingCache()
        largest_output = max((s.max_output_bytes for s in self.sessions.values()), default=0)
        self.ring = own_ring(self.cfg, self.worker, largest_output)

    def init_lanes(self) -> None:
        on_gpu = any(s.provider == "CUDAExecutionProvider" for s in self.sessions.values())
        idle = self.cfg.load_priority == "idle"  # the background lane is as polite as a run-time load
        self.lanes = Lanes(1 if on_gpu else self.cfg.executor_lanes,  # one stream on a GPU: one lane
                           lower=lambda: lower_priority(idle),
                           spare=self.cfg.executor_spare_lane and not on_gpu)
        self.bg_runs: dict[str, int] = {}  # per version: batches run on the background lane
        self.spare_runs: dict[str, int] = {}  # per version: batches run on the spare lane
        self.wake_fds.append(self.lanes.wake_fd)

    def hello_fields(self) -> dict:
        direct = set(self.inline_pre.advertised(self.inline.advertised()))
        return {"ring": self.ring.seg.name, "gpus": gpu_count(), "failed": dict(self.failed),
                "providers": {k: s.provider for k, s in self.sessions.items()},
                "sessions": {k: {**s.describe(), "idle_wide_session": self.builder.wide_for(k) is not None,
                                 "background_runs": self.bg_runs.get(k, 0),
                                 "spare_runs": self.spare_runs.get(k, 0),
                                 "postprocess": self.inline.choices[k].view() if k in self.inline.choices
                                 else None,
                                 "preprocess": self.inline_pre.view(k, k in direct)}
                             for k, s in self.sessions.items()}}

    def hello_msg(self) -> m.Hello:
        hello = super().hello_msg()
        hello.inline_post = self.inline.advertised()
        hello.inline_pre = self.inline_pre.advertised(hello.inline_post)
        hello.inline_pre_any = self.inline_pre.advertised_any_load(hello.inline_post)
        return hello

    # -- the loop ---------------------------------------------------------------
    def after_drain(self, now: float) -> int:
        self.direct.poll(self.poller, self.ready)
        self.versions.poll()
        for job in self.lanes.finished():
            self.finish_batch(job)
        for p in self.batcher.expire(now) + self.bg_batcher.expire(now):
            self.drop(p)  # the frontend answers TIMEOUT itself
        wake = []
        for batcher, free in ((self.batcher, self.lanes.free), (self.bg_batcher, self.lanes.bg_free)):
            wake_at = None
            while free():
                key, batch, wake_at = (batcher.next_batch(now, self.lanes.running, self.lanes.n)
                                       if batcher is self.batcher else batcher.next_batch(now))
                if key is None:
                    break
                self.start_batch(key, batch, background=batcher is self.bg_batcher)
            if wake_at is not None and free():
                wake.append(wake_at)
        if not self.lanes.free() and self.lanes.spare_free():
            only = self.batcher.spare_models(self.lanes.running)
            key, batch, wake_at = self.batcher.next_batch(now, only=only) if only else (None, [], None)
            if key is not None:
                self.start_batch(key, batch, spare=True)
            elif wake_at is not None:
                wake.append(wake_at)
        if wake:
            return max(0, int((min(wake) - now) * 1000) + 1)
        return 200  # a finished lane or a new task wakes the loop

    def drop(self, p: Pending) -> None:
        """A queued request leaves without a run, and without an answer: its input is freed."""
        if p.payload.ref is None:  # inline-preprocessed: its input is ours alone
            self.direct.expire(p.rid)
        else:
            self.inputs.release(p.payload.ref)  # an input slot: ours since we took the task

    def on_soon(self, msg: m.Soon, frames: list) -> None:
        """A lone request is on its way from a preprocess worker: wait awake for it and, if its batch will
        run here at once and quickly, have its postprocess worker wait awake for the answer (told now, while
        this loop has nothing else to do, not on the request's way)."""
        super().on_soon(msg, frames)
        if (msg.post and msg.post != EXECUTOR and self.quick(msg.key) and self.lanes.busy == 0
                and self.batcher.pending() == 0):
            self.soon(msg.post)

    def on_infer(self, task: m.InferTask, frames: list) -> None:
        self.came()
        self.accept(task)

    def accept(self, task: m.InferTask, descs: list | None = None) -> bool:
        """Queue ``task`` for a batch (``descs``: its tensors, when not in a ring slot); False when it
        was failed."""
        key = f"{task.model}:{task.version}"
        sess = self.sessions.get(key)
        if sess is None:  # a model that failed to load is unavailable, not an internal error
            if key in self.failed:
                self.fail(task.rid, UNAVAILABLE, self.failed[key], task.ref)
            else:
                self.fail(task.rid, INTERNAL, f"executor does not serve {key}", task.ref)
            return False
        problem = sess.check_shapes(task.ref.tensors if descs is None else descs)
        if problem:
            self.fail(task.rid, INVALID_INPUT, problem, task.ref)
            return False
        if not self.outputs.knows(task.post) and not (task.post == EXECUTOR and self.inline.serves(key)):
            self.fail(task.rid, INTERNAL, f"no postprocess worker named {task.post!r}", task.ref)
            return False
        now = time.monotonic()
        task.trail.exec_arrived = now
        batcher = self.bg_batcher if task.background else self.batcher
        shape = sess.shape_key(task.ref.tensors if descs is None else descs) if sess.exact else None
        batcher.put(key, Pending(task.rid, task.seq_len, now, task.deadline, task, shape), task.upstream)
        return True

    def start_batch(self, key: str, batch: list[Pending], background: bool = False,
                    spare: bool = False) -> None:
        sess = self.sessions[key]
        feeds, sizes, live = self.assemble(sess, batch)
        if not live:
            return
        # A lone small batch while the server is idle gets every core (the wide session): at low load
        # the lanes' one-thread runs would leave a core unused and double the latency of a long input;
        # under load every lane runs its own batch on one thread.  Idle means the executor's own queue
        # and lanes are empty *and* each request was sent alone (``InferTask.alone``, the frontend's
        # idle rule): an executor waiting on a busy pool is not an idle machine, and a second core
        # taken then is the one a preprocess worker needed (orientation at c=8: 155 -> 143 req/s).
        wide = self.builder.wide_for(key)
        lone = (self.lanes.busy == 0 and self.batcher.pending() == 0 and len(live) <= WIDE_MAX_ROWS
                and all(p.payload.alone for p in live))
        runner = wide if wide is not None and lone and not background else sess
        # the cost model describes the serving lanes' runs (a background run's time says little, and a
        # spare-lane run shares the cores with full lanes)
        learn = runner is sess and not background and not spare
        job = Job(lambda: runner.run(feeds), (key, sess, sizes, live, learn), background, key, spare)
        # the loop would only wait for it: run it here, no hand-off to a lane and back (measured: about 0.5 ms
        # of two thread wake-ups at concurrency 1 for the wide session; 0.1 ms for a run of tabular's size)
        if runner is wide or (lone and not background and not spare and self.quick(key)):
            job.run()
            self.finish_batch(job)
            return
        self.lanes.submit(job)

    def quick(self, key: str) -> bool:
        """Does a run of ``key`` take at most ``QUICK_RUN_S`` (measured, smoothed)?  Such a lone batch runs
        in the loop: an arrival meanwhile waits no longer than its hand-off to a lane would take."""
        q = self.batcher.queues.get(key)
        return q is not None and q.run_s is not None and q.run_s <= QUICK_RUN_S

    def finish_batch(self, job: Job) -> None:
        key, sess, sizes, live, learn = job.context
        for p in live:
            if p.payload.ref is None:
                self.direct.take(p.rid)  # its input, no longer needed
        if job.error is not None:  # a failing run fails its batch, not the executor
            self.log.error("%s: run failed: %s: %s", key, type(job.error).__name__, job.error)
            for p in live:
                self.fail(p.rid, INTERNAL, f"model run failed: {type(job.error).__name__}")
            return
        infer_us = job.run_ns // 1000
        padded = max((max(s.values(), default=0) for s in sizes), default=0)
        if job.background or job.spare:  # shown at the next heartbeat, re-encoded then (not once per run)
            runs = self.bg_runs if job.background else self.spare_runs
            runs[key] = runs.get(key, 0) + 1
            self.hello_stale = True
        if learn:  # the cost model describes the serving lanes' runs, which carry the load
            self.batcher.observe(key, len(live), padded, infer_us / 1e6)
        self.outputs.deliver(key, sess, job.result, sizes, live, job.started, infer_us, padded)

    def assemble(self, sess: ModelSession, batch: list[Pending]):
        """Copy each request's tensors into padded batch arrays; free input slots."""
        views, live = [], []
        for p in batch:
            ref = p.payload.ref
            if ref is None:  # preprocessed here (inline_pre): its tensors are in this process
                views.append((None, None, self.direct.tensors(p.rid)))
                live.append(p)
                continue
            try:
                ring = self.inputs.get(ref.seg)
            except (FileNotFoundError, ValueError):
                self.fail(p.rid, UNAVAILABLE, m.PRE_WORKER_GONE)
                continue
            if not ring.holds(ref.slot, ref.gen):
                continue  # answered already (freed when a holder died): never read a reused slot
            views.append((ring, ref, ring.views(ref.slot, ref.tensors)))
            live.append(p)
        feeds, sizes = sess.feeds_from([v[2] for v in views]) if views else ({}, [])
        for ring, ref, _ in views:
            if ring is not None:
                ring.free(ref.slot, ref.gen)  # the rows are copied into the batch: the slot may be reused
        return feeds, sizes, live

    def fail(self, rid: int, code: str, message: str, ref: m.Ref | None = None, stage: str = "") -> None:
        if ref is not None:
            self.inputs.release(ref)  # an input slot: ours to free once we took the task
        self.send(m.Failed(rid, code, message, stage=stage))

    def close(self) -> None:
        self.direct.close()
        self.lanes.close()
        self.outputs.close()
        super().close()
        self.inputs.close()
        self.ring.close()
        self.ring.seg.unlink()
