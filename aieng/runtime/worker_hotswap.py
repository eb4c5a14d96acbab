"""Run-time load and unload of one model version inside a worker (the worker side of hot swap).

``Versions`` offers two handlers (``handlers``), which its worker puts in its own dispatch table:
  * ``LoadVersion(spec)``: build the role's state for that version with the role's own ``build``,
    store it under ``model:version``, answer ``VersionLoaded`` (with the build's footprint when it was
    quiet, ``footprint.Quiet``; else 0) or ``VersionFailed`` (one line, why).  Idempotent.
  * ``UnloadVersion(key)``: drop what was built (the frontend drained the version's requests first)
    and return the memory to the OS where glibc can (``malloc_trim``).
With ``background=True`` (the executor) ``build`` runs on a thread and the loop collects finished
builds in ``poll()`` (from ``after_drain``) and installs them there: every shared structure is
touched by the loop thread only.  ``check(key, built)`` may refuse a build the worker cannot use with
a ``ValueError``.  It gets what it needs of its worker as arguments (its name, ``send``, its log and
``hello_changed``, called after each change so the worker rebuilds its heartbeat) and writes none of the
worker's fields.  Priorities, timings and footprints:
docs/rollout.md, '9. Loading and unloading versions while serving'.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.runtime.footprint import Quiet, gpu_bytes, on_cuda, release_free_memory, rss_bytes
from aieng.wire import messages as m


def lower_priority(idle: bool = False) -> None:
    """The calling thread (only it: Linux scheduling is per thread) to nice 10, and with ``idle`` to
    SCHED_IDLE too: it then runs only on a core nothing else wants, and any serving thread that wakes
    takes the core back at once (at nice 10 the scheduler may first let it finish a slice: measured, one
    slow request of a 5 ms neighbour per swap).  Threads it creates inherit this, and an unprivileged
    process cannot undo it: never call it before creating threads that serve."""
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < 10:  # a process started nicer keeps its nice value
            os.setpriority(os.PRIO_PROCESS, tid, 10)
    except OSError:  # refused: the build runs at the priority it has
        pass
    if idle:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):  # not Linux, or refused
            pass


class Versions:
    def __init__(self, worker: str, send: Callable[[Any], None], hello_changed: Callable[[], None],
                 log: logging.Logger, store: dict[str, Any], failed: dict[str, str],
                 build: Callable[[ModelSpec, bool], Any], background: bool = False,
                 check: Callable[[str, Any], None] | None = None,
                 on_add: Callable[[ModelSpec, Any], None] | None = None,
                 on_remove: Callable[[str], None] | None = None, defer: bool = False, gpu: bool = False):
        """``worker`` names the worker in its answers, sent with ``send(msg)``; ``store`` and ``failed``
        are the worker's built state and failed loads by ``model:version``, kept here as versions come
        and go; ``gpu``: a build's GPU memory growth is measured too (the executor)."""
        self.worker, self.send, self.hello_changed, self.log = worker, send, hello_changed, log
        self.store, self.failed, self.gpu = store, failed, gpu
        self.build, self.background, self.check = build, background, check
        # ``defer``: a load is built after the tasks that arrived with it (``build_deferred``, called by
        # the worker at the end of its drain), so a build never delays requests it already holds
        self.defer, self.deferred = defer, []  # (spec, urgent)
        self.on_add, self.on_remove = on_add, on_remove
        self.building: set[str] = set()
        # (spec, built, error, seconds, RSS growth, GPU growth, quiet), appended by build threads
        self.done: list[tuple[ModelSpec, Any, BaseException | None, float, int, int, bool]] = []
        self.lock = threading.Lock()
        self.quiet = Quiet()  # was a build's growth its own (no other build or unload meanwhile)?
        self.handlers = {m.LoadVersion: self.on_load, m.UnloadVersion: self.on_unload}

    def on_load(self, msg: m.LoadVersion, frames: list) -> None:
        spec = msg.spec
        if spec.key in self.store:
            self.send(m.VersionLoaded(self.worker, spec.key, 0.0))
            return
        if spec.key in self.building:
            return  # its answer comes when the build ends
        self.building.add(spec.key)
        if self.background:
            threading.Thread(target=self._build, args=(spec, msg.urgent), name=f"load-{spec.key}",
                             daemon=True).start()
        elif self.defer:
            self.deferred.append((spec, msg.urgent))
        else:
            self._build(spec, msg.urgent)
            self.poll()

    def build_deferred(self) -> None:
        """Build the loads that arrived in this drain (``defer``), now that its tasks are handled."""
        while self.deferred:
            spec, urgent = self.deferred.pop(0)
            if urgent:  # a request waits for it: now, at the worker's priority
                self._build(spec, True)
                continue
            # On a thread of its own at nice 10 (the worker waits for it: it is out of the rotation
            # meanwhile), so a tokenizer's parse (30-50 ms) takes a core only when serving leaves it
            # one.  Not SCHED_IDLE: on a saturated server that would keep the worker out for seconds.
            builder = threading.Thread(target=self._build_polite, args=(spec,), name=f"load-{spec.key}")
            builder.start()
            builder.join()
        self.poll()

    def _build_polite(self, spec: ModelSpec) -> None:
        lower_priority()
        self._build(spec, False)

    def _build(self, spec: ModelSpec, urgent: bool) -> None:
        ticket = self.quiet.begin()
        t0, rss0 = time.perf_counter(), rss_bytes()
        gpu0 = gpu_bytes() if self.gpu else 0
        built, error = None, None
        try:
            built = self.build(spec, urgent)
        except BaseException as exc:  # any failure is this version's alone
            error = exc
        footprint = max(0, rss_bytes() - rss0) if rss0 else 0
        gpu = max(0, gpu_bytes() - gpu0) if on_cuda(built) else 0
        quiet = self.quiet.end(ticket)
        with self.lock:
            self.done.append((spec, built, error, time.perf_counter() - t0, footprint, gpu, quiet))

    def poll(self) -> None:
        """Install finished builds (on the worker's loop thread) and answer the frontend."""
        if not self.done:
            return
        with self.lock:
            done, self.done = self.done, []
        refused = []  # built but refused by ``check``: released together, as an unload is
        for spec, built, error, seconds, footprint, gpu, quiet in done:
            self.building.discard(spec.key)
            if error is None and self.check is not None:
                try:
                    self.check(spec.key, built)
                except ValueError as exc:
                    error = exc
                    refused.append(built)
            if error is not None:
                why = model_repo.failure_message(spec, error)
                self.log.error("run-time load failed: %s", why)
                self.send(m.VersionFailed(self.worker, spec.key, why))
                continue
            self.store[spec.key] = built
            self.failed.pop(spec.key, None)
            if self.on_add is not None:
                self.on_add(spec, built)
            self.log.info("loaded %s at run time in %.2fs (RSS +%.1f MiB%s)", spec.key, seconds,
                                 footprint / 2**20, "" if quiet else " while another load or an unload ran: "
                                 "not its footprint, reported as not measured")
            if not quiet:
                footprint = gpu = 0
            self.send(m.VersionLoaded(self.worker, spec.key, round(seconds, 3), footprint, gpu))
        if refused:
            with self.quiet.moving():
                del refused, done, built
        self.hello_changed()

    def on_unload(self, msg: m.UnloadVersion, frames: list) -> None:
        with self.quiet.moving():  # a build meanwhile would read less than its own growth
            gone = self.store.pop(msg.key, None)
            self.failed.pop(msg.key, None)
            if self.on_remove is not None:
                self.on_remove(msg.key)
            del gone  # the last reference: the session (or state) is released here
            trimmed = release_free_memory()
        self.log.info("unloaded %s%s", msg.key, " (free heap returned to the OS)" if trimmed else "")
        self.hello_changed()
