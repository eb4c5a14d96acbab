"""Executor lanes: whole batches run concurrently on a few threads, one ONNX Runtime run each.

``lanes`` threads each run a whole batch on ``AIENG_INTRA_OP_THREADS`` intra-op threads (default: usable
CPUs / lanes, one each up to 4 CPUs), so every core does useful work and the loop assembles the next batch
meanwhile (ONNX Runtime releases the GIL during ``run``; one session
serves concurrent runs).  One more, the *background* lane, runs internal verification batches
(``InferTask.background``) one at a time on a thread that lowered itself first (``lower``).  With
``spare``, one more, the *spare* lane, runs one short batch while every serving lane is busy (the batcher's
``spare_models`` says which may); its runs are not counted in ``running`` or ``busy``, so the serving lanes'
sharing rule is unchanged.  Why, measured: docs/architecture.md, 'Executor lanes'.

Contract:
  * ``submit`` and ``finished`` are called from the loop thread only; ``submit`` only while
    ``free() > 0`` (``bg_free()`` for the background lane).
  * A lane calls ``job.run()`` (pure compute: no sockets, no rings), puts the finished job on the done
    queue and writes one byte to ``wake_fd``, which the loop polls; the loop does all socket and ring
    work, so nothing here needs a lock.
  * ``close`` stops the lanes (a ``None`` job each) and joins them.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from collections import Counter
from typing import Any, Callable


class Job:
    """One batch: ``fn()`` computes ``result`` (or ``error``) on a lane; the rest is the loop's."""

    __slots__ = ("fn", "context", "result", "error", "started", "run_ns", "background", "key", "spare")

    def __init__(self, fn: Callable[[], Any], context: Any, background: bool = False, key: str = "",
                 spare: bool = False):
        self.fn, self.context, self.background, self.key = fn, context, background, key  # key: its model
        self.spare = spare  # on the spare lane (``Lanes.spare_free``)
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = 0.0  # monotonic seconds the run began
        self.run_ns = 0

    def run(self) -> None:
        self.started = time.monotonic()
        t0 = time.perf_counter_ns()
        try:
            self.result = self.fn()
        except Exception as exc:  # a failing run fails its batch, never the lane
            self.error = exc
        self.run_ns = time.perf_counter_ns() - t0


class Lanes:
    def __init__(self, n: int, lower: Callable[[], None] | None = None, spare: bool = False):
        self.n = n
        self.busy = 0
        self.bg_busy = 0
        self.spare = spare
        self.spare_busy = 0
        self.spare_todo: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.running: Counter = Counter()  # model key -> serving lanes running its batches now
        self.todo: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.bg_todo: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        self.threads = [threading.Thread(target=self._lane, args=(self.todo,), name=f"lane-{i}", daemon=True)
                        for i in range(n)]
        self.threads.append(threading.Thread(target=self._lane, args=(self.bg_todo, lower), name="lane-bg",
                                             daemon=True))
        if spare:
            self.threads.append(threading.Thread(target=self._lane, args=(self.spare_todo,),
                                                 name="lane-spare", daemon=True))
        for t in self.threads:
            t.start()

    def _lane(self, todo: queue.SimpleQueue, lower: Callable[[], None] | None = None) -> None:
        if lower is not None:
            lower()
        while True:
            job = todo.get()
            if job is None:
                return
            job.run()
            self.done.put(job)
            os.write(self._wake_w, b"x")

    def free(self) -> int:
        return self.n - self.busy

    def bg_free(self) -> bool:
        return self.bg_busy == 0

    def spare_free(self) -> bool:
        return self.spare and self.spare_busy == 0

    def submit(self, job: Job) -> None:
        if job.background:
            self.bg_busy += 1
            self.bg_todo.put(job)
        elif job.spare:
            self.spare_busy += 1
            self.spare_todo.put(job)
        else:
            self.busy += 1
            self.running[job.key] += 1
            self.todo.put(job)

    def finished(self) -> list[Job]:
        """Jobs done since the last call (empties the wake pipe)."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass
        out = []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                break
        bg = sum(1 for job in out if job.background)
        spare = sum(1 for job in out if job.spare)
        self.bg_busy -= bg
        self.spare_busy -= spare
        self.busy -= len(out) - bg - spare
        for job in out:
            if not job.background and not job.spare:
                self.running[job.key] -= 1
                if not self.running[job.key]:
                    del self.running[job.key]
        return out

    def close(self, timeout: float = 5.0) -> None:
        for _ in range(self.n):
            self.todo.put(None)
        self.bg_todo.put(None)
        self.spare_todo.put(None)
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            return  # a run still going writes to the pipe when it ends: leave it to the process exit
        os.close(self.wake_fd)
        os.close(self._wake_w)
