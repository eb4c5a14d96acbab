"""The executor's session builder: a model's verified, warmed-up session, and the idle-time wide ones.

``SessionBuilder.build`` checks the file against the hash the supervisor took, builds the lanes'
session, warms it and has ``InlinePost``/``InlinePre`` consider where the version's postprocessing and
preprocessing run.  At start (``wide``) it also builds a session on every core for a lone small batch
while the executor is idle (not for a graph whose one-row warm-up run is under ``WIDE_MIN_US``: more
threads have nothing to split there, and the second session would double its memory; a hundred small
models); it owns those (``wide_for``, ``drop``).  A run-time load (``background``)
builds beside serving at low priority (``AIENG_LOAD_PRIORITY``) with a short, paced warm-up; a cold
load a request waits for (``urgent``) at the caller's priority, unpaced (docs/rollout.md, section 9).
A config.pbtxt's ``model_warmup`` samples run after the warm-up, before ready (``warm_samples``).
"""
from __future__ import annotations

import logging
import time

from aieng.config import Config
from aieng.envs import cpu_count
from aieng.gpu_executor.inline_post import InlinePost
from aieng.gpu_executor.inline_pre import InlinePre
from aieng.gpu_executor.sessions import ModelSession
from aieng.gpu_executor.warm_samples import run_samples
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.runtime.worker_hotswap import lower_priority

WIDE_MAX_ROWS = 4  # the most rows a lone batch may have to run on the wide session
# a lane session's one-row run shorter than this gets no wide session: ONNX Runtime's parallel ops gain
# little over the threads' wake-ups in a run that short (tabular's 23 us), and the second session is as big
# as the first (a repository of a hundred small graphs held two sessions each)
WIDE_MIN_US = 1000


def too_quick(sess: ModelSession) -> str:
    """Why ``sess`` gets no wide session, from its warm-up's timed one-row run ("" when it may, or when
    its warm-up timed none)."""
    one = [t for rows, _length, t in getattr(sess, "warm_costs", ()) if rows == 1]
    if one and one[0] * 1e6 < WIDE_MIN_US:
        return f"no idle-time wide session: a one-row run takes {one[0] * 1e6:.0f} us, under {WIDE_MIN_US}"
    return ""


class SessionBuilder:
    def __init__(self, cfg: Config, log: logging.Logger, inline: InlinePost, inline_pre: InlinePre):
        self.cfg, self.log, self.inline, self.inline_pre = cfg, log, inline, inline_pre
        self.wide: dict[str, ModelSession] = {}  # every core on one run: for a lone batch while idle

    def wide_for(self, key: str) -> ModelSession | None:
        return self.wide.get(key)

    def drop(self, key: str) -> None:
        self.wide.pop(key, None)

    def build(self, spec: ModelSpec, wide: bool = True, background: bool = False,
              urgent: bool = False) -> ModelSession:
        """A verified, warmed-up session (and, at start, the idle-time wide one).  ``background``: a
        run-time load beside serving, at low priority (``AIENG_LOAD_PRIORITY``) with a short, paced
        warm-up (``paced_warmup``); ``urgent`` (a cold load a request waits for): the same short warm-up,
        at the loop's priority and unpaced."""
        t0 = time.perf_counter()
        threads = self.cfg.intra_op_threads or max(1, cpu_count() // self.cfg.executor_lanes)
        idle, polite = self.cfg.load_priority == "idle", background and not urgent
        if polite and threads == 1:  # one thread: the session makes no pool threads that inherit it
            lower_priority(idle)  # hashing and optimising a 90 MB model take 0.2+ s of a core each
        model_repo.verify_content(spec)  # never load a file that changed under us
        sess = ModelSession(spec, self.cfg.device, threads, self.cfg.ort_spinning)
        if polite:
            runs = paced_warmup(sess, idle)
        else:
            runs = sess.warmup(max_rows=BACKGROUND_WARM_ROWS if background else self.cfg.warmup_max_rows)
        warm_samples = run_samples(sess, spec)  # config.pbtxt's model_warmup, before the version is ready
        runs += warm_samples
        choice = self.inline.consider(spec, sess)  # in force once the version joins the batcher
        pre_why = self.inline_pre.consider(spec, sess)  # likewise
        quick = ""
        if (wide and self.cfg.idle_wide_runs and threads < cpu_count()
                and sess.provider == "CPUExecutionProvider"):
            quick = too_quick(sess)
            runs += 0 if quick else self.build_wide(spec)
        how = ""
        if background:
            how = (f" (beside serving: at {'idle' if idle else 'low'} priority, warm-up paced)" if polite
                   else " (cold load, a request waits: at normal priority)")
        samples = f" ({warm_samples} of them model_warmup's samples)" if spec.warmup else ""
        self.log.info("loaded %s (%s) on %s, %d warm-up runs%s in %.2fs%s; postprocessing in the %s (%s); "
                      "preprocessing: %s%s", spec.key, spec.content_hash[:12], sess.provider, runs, samples,
                      time.perf_counter() - t0, how, choice.where, choice.why, pre_why,
                      f"; {quick}" if quick else "")
        return sess

    def build_wide(self, spec: ModelSpec) -> int:
        """The idle-time wide session of ``spec``; its warm-up runs (0 without one)."""
        try:  # an optional speed-up: the model serves on its lanes without it
            w = ModelSession(spec, self.cfg.device, cpu_count(), self.cfg.idle_wide_spinning)
            # never more rows than the model takes: layout's and textdet's inputs hold one image, and
            # warming them at 4 rows failed, which left them without their wide session (c=1 ran on
            # one thread: 125 ms against 73 ms for layout)
            runs = w.warm_small(min(WIDE_MAX_ROWS, int(spec.batching.max_batch_size)))
        except Exception as exc:
            self.log.warning("%s: no idle-time wide session (%s: %s)", spec.key, type(exc).__name__, exc)
            return 0
        self.wide[spec.key] = w
        return runs


BACKGROUND_WARM_ROWS = 8  # a run-time load warms batches up to this many rows (see ModelSession.warmup)
WARM_DUTY = 0.5  # a background warm-up runs at most this share of the time: serving keeps the cores


def paced_warmup(sess: ModelSession, idle: bool) -> int:
    """A run-time load's ``sess.warmup()`` on the loader thread (batches of at most
    ``BACKGROUND_WARM_ROWS``), made polite: the thread drops to low priority (its own; the session's
    pool threads, made earlier, keep their priority for serving later: ``lower_priority``) and sleeps
    after each warm-up run for as long as the run took.  A swap takes longer; the models serving
    meanwhile keep their latency (measured: docs/bench/hotswap_measure.py)."""
    lower_priority(idle)
    run = sess.run

    def paced(feeds):
        t0 = time.perf_counter()
        try:
            return run(feeds)
        finally:
            time.sleep((time.perf_counter() - t0) * (1 - WARM_DUTY) / WARM_DUTY)

    sess.run = paced  # this instance only, for the warm-up
    try:
        return sess.warmup(max_rows=BACKGROUND_WARM_ROWS)
    finally:
        del sess.run
