"""Model pool, wired: lazy versions load on their first request; LRU eviction under a memory budget.

The rules are pure (``pool.py``); this module feeds them the frontend's events and acts on the
answers through the hot swap path (``hotswap.py``), so a lazily loaded version is built, warmed and
golden-checked exactly like an ``aieng models load``.

States of a version of a lazy model (``pool: {lazy: true}`` in ``<model>/model.yaml``)::

    cold --request--> loading --golden set passed--> resident --plan() picks it--> evicted
      ^                  | load failed / refused                                      |
      +------------------+               evicted --request--> loading  <--------------+

* ``start(req, inputs)``: an admitted request.  A resident version (every eager one) is touched
  (LRU) and dispatched now.  A request for a cold, evicted or loading one is first checked
  (``inputs.precheck``: the workers' own checks that need neither processor nor session), so one
  that would fail INVALID_INPUT is answered so at once and never loads or evicts anything; then it
  waits here in ``ColdStarts`` (bounded per version by ``AIENG_MAX_INFLIGHT``; full: OVERLOADED)
  and, unless one is under way, a hot swap load starts.
* ``make_room`` (called by ``HotSwap.load`` for any cold version, ``aieng models load`` too):
  ``Pool.plan`` picks the least recently used evictable versions with nothing in flight and no
  request in the last ``AIENG_POOL_WARM_S`` (30 s), they are evicted (released in every worker:
  their drain is empty, ``plan`` takes only idle ones), and the version's estimated footprint is
  reserved.  When the load cannot fit (pinned, busy or warm versions hold the rest, or it is bigger
  than the whole budget) the load is refused at once: the waiters get UNAVAILABLE naming the budget.
  So a warm version in steady use is never evicted by someone cycling cold versions: their loads
  are refused until it has been idle for ``AIENG_POOL_WARM_S``.
* ``on_ready``: every waiter still within its deadline is dispatched; the measured footprint
  replaces the reservation; ``aieng_model_cold_load_seconds`` observes the load.  ``on_failed``:
  every waiter gets UNAVAILABLE with the load's error; the version stays cold (a later request
  tries again).  ``sweep``: a waiter whose deadline passes first gets UNAVAILABLE "cold start".
* Waiters are answered here (they are not in the request table), each exactly once: by dispatch,
  by an error above, or by ``fail_all`` on the way down.

Footprint: the executor's growth across the build (``VersionLoaded``; its GPU growth from NVML when
its session runs on CUDA), reported only when no other build or unload overlapped it
(aieng/runtime/footprint.py); each such reading replaces the last (``Pool.loaded``).  Until a first
measurement, the largest measured within the budget of the model's other versions, else the model
file's size.  A measurement above the whole budget is retried after ``AIENG_POOL_REMEASURE_S`` (60 s)
rather than refused for good.  Preprocess/postprocess state is shown per worker, not budgeted.  Eager
models are pinned; versions built at start are not measured (they are outside the budget).
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from aieng.frontend.requests.table import Request
from aieng.frontend.versions.load import Load
from aieng.frontend.versions.pool import ColdStarts, Pool, PoolSetting, cold_start_message, refusal
from aieng.inputs import precheck
from aieng.wire import protocol as p

if TYPE_CHECKING:  # pragma: no cover
    from aieng.frontend.server import Frontend

log = logging.getLogger("aieng.frontend.versions.poolctl")
REFUSAL_LOG_S = 10.0  # a version's refused loads are logged once per this many seconds (a thrashing client)


def _pair(key: str) -> tuple[str, str]:
    name, _, version = key.partition(":")
    return name, version


def footprint_of(footprints: dict[str, int]) -> int:
    """The budgeted bytes of one load from each worker's report: the executor's GPU growth when it
    reported one, else its RSS growth (``load.Load.footprint``; GPU entries end in ``:gpu``)."""
    gpu = [v for k, v in footprints.items() if "executor" in k and k.endswith(":gpu") and v > 0]
    if gpu:
        return max(gpu)
    return max((v for k, v in footprints.items() if "executor" in k and not k.endswith(":gpu")), default=0)


class PoolControl:
    def __init__(self, fe: "Frontend"):
        self.fe = fe
        self.pool = Pool(fe.cfg.model_memory_budget, fe.cfg.pool_warm_s, fe.cfg.pool_remeasure_s)
        self.waiting: ColdStarts[Request] = ColdStarts(fe.cfg.max_inflight)
        self.settings = {name: PoolSetting(**(next(iter(vs.values())).extra.get("pool") or {}))
                         for name, vs in fe.specs.items()}
        self.cold = {k for k in fe.cfg.cold_versions if _pair(k)[1] in fe.specs.get(_pair(k)[0], {})}
        self.evictions: dict[str, int] = {}
        self.cold_loads: dict[str, float] = {}  # key -> seconds of its last cold load
        self.refused: dict[str, tuple[float, int]] = {}  # key -> (when last logged, refusals since)
        for key in sorted(self.cold):
            fe.hotswap.loads[key] = Load(*_pair(key), "pool", state="cold")
        for name, vs in fe.specs.items():  # resident now (eager, or lazy and loaded before a restart)
            for v in vs:
                if f"{name}:{v}" not in self.cold:
                    self.pool.loaded((name, v), 0, self.settings[name].evictable, float("-inf"))

    # -- queries ------------------------------------------------------------------------------
    def is_cold(self, key: str) -> bool:
        return key in self.cold

    def state(self, key: str) -> str:
        """resident, loading, evicted or cold (never loaded, or its last load failed)."""
        if key not in self.cold:
            return "resident"
        if self.fe.hotswap.busy(key):
            return "loading"
        ld = self.fe.hotswap.loads.get(key)
        return "evicted" if ld is not None and ld.state == "evicted" else "cold"

    def estimate(self, pk: tuple[str, str], now: float) -> int:
        """A load's bytes: its last measured footprint (``Pool.need``), else the largest measured within
        the budget of its model's other versions (usually one architecture), else its model file's size."""
        siblings = [self.pool.measured((pk[0], v)) for v in self.fe.specs.get(pk[0], {}) if v != pk[1]]
        default = max([_file_size(self.fe.specs[pk[0]][pk[1]].onnx_path)] + siblings)
        return self.pool.need(pk, default, now)

    def waiters(self) -> int:
        return sum(self.waiting.waiting(k) for k in self.cold)

    # -- requests -----------------------------------------------------------------------------
    def start(self, req: Request, inputs: Any) -> bool:
        """Dispatch ``req`` now (True), or hold it for its version's cold load (False); ``inputs`` is
        the request's ``inputs`` map, checked before it may start a load."""
        key = req.key
        if key not in self.cold:
            self.pool.touch(_pair(key), time.monotonic())
            self.fe.pipeline.start(req)
            return True
        try:
            precheck(self.fe.specs[req.model][req.version], inputs)
        except p.RequestError as exc:
            self.answer(req, exc.code, exc.message)
            return False
        if not self.waiting.add(key, req.deadline, req):
            self.answer(req, p.OVERLOADED, f"model {key} is loading (cold start) and "
                                           f"{self.waiting.max_waiting} requests wait for it already")
            return False
        if not self.fe.hotswap.busy(key):
            self.begin_load(key)
        return False

    def begin_load(self, key: str) -> None:
        try:
            self.fe.hotswap.load(*_pair(key), source="cold")  # which makes room first (make_room)
        except p.RequestError as exc:
            self.release_waiters(key, p.UNAVAILABLE,
                                 f"model {key} cannot be loaded (cold start): {exc.message}")

    def make_room(self, key: str) -> None:
        """Before any load of a cold version (a request's, or ``aieng models load``): evict what the
        plan says and reserve the load's estimate, or raise ``protocol.RequestError`` naming the budget."""
        fe, pk, now = self.fe, _pair(key), time.monotonic()
        need = self.estimate(pk, now)
        self.pool.set_inflight({_pair(k): n for k, n in fe.table.per_model().items()})
        victims = self.pool.plan(pk, need, now)
        if victims is None:
            why = refusal(pk[0], pk[1], need, self.pool.budget, self.pool.stuck(pk, now), self.pool.warm_s,
                          self.pool.retry_in(pk, now))
            self.log_refusal(key, why, now)
            raise p.RequestError(p.UNAVAILABLE, why)
        for victim in victims:
            self.evict(f"{victim[0]}:{victim[1]}", for_key=key)
        self.pool.reserve(pk, need)

    def log_refusal(self, key: str, why: str, now: float) -> None:
        last, since = self.refused.get(key, (float("-inf"), 0))
        if now - last < REFUSAL_LOG_S:
            self.refused[key] = (last, since + 1)
            return
        self.refused[key] = (now, 0)
        more = f" (and {since} more since the last line)" if since else ""
        log.warning("load of %s refused%s: %s", key, more, why)

    def evict(self, key: str, for_key: str) -> None:
        """Release an idle resident version everywhere; it stays routable and comes back on use."""
        fe, pk = self.fe, _pair(key)
        self.pool.unloaded(pk)
        prev = fe.hotswap.loads.get(key)
        fe.hotswap.release(key)
        fe.hotswap.loads[key] = Load(*pk, "pool", state="evicted",
                                     footprint=dict(prev.footprint) if prev is not None else {})
        self.cold.add(key)
        self.evictions[key] = self.evictions.get(key, 0) + 1
        fe.metrics.eviction(*pk)
        log.warning("evicted %s (least recently used) to load %s within the memory budget of %d bytes",
                    key, for_key, self.pool.budget)

    # -- hot swap outcomes --------------------------------------------------------------------
    def on_ready(self, ld: Load) -> None:
        key, pk, now = f"{ld.name}:{ld.version}", (ld.name, ld.version), time.monotonic()
        self.pool.loaded(pk, footprint_of(ld.footprint), self.settings.get(ld.name, PoolSetting()).evictable,
                         now, default=self.estimate(pk, now))
        if key not in self.cold:
            return
        self.cold.discard(key)
        if ld.source == "cold":
            self.cold_loads[key] = ld.seconds
            self.fe.metrics.cold_load(ld.name, ld.version, ld.seconds)
        now = time.monotonic()
        for req in self.waiting.ready(key):
            if req.deadline <= now:
                self.answer(req, p.UNAVAILABLE, cold_start_message(key))
            else:
                self.pool.touch(pk, now)
                self.fe.pipeline.start(req)

    def on_failed(self, ld: Load) -> None:
        key = f"{ld.name}:{ld.version}"
        self.pool.unloaded((ld.name, ld.version))
        if key in self.cold:
            self.release_waiters(key, p.UNAVAILABLE,
                                 f"model {key} could not be loaded (cold start): {ld.error}")

    def on_unloaded(self, key: str) -> None:
        """An admin unload took the version out of service: the pool forgets it."""
        self.pool.unloaded(_pair(key))
        self.cold.discard(key)
        self.release_waiters(key, p.MODEL_NOT_FOUND, f"model {key} was unloaded")

    # -- answers ------------------------------------------------------------------------------
    def release_waiters(self, key: str, code: str, message: str) -> None:
        for req in self.waiting.failed(key):
            self.answer(req, code, message)

    def answer(self, req: Request, code: str, message: str) -> None:
        """An error for a request that never entered the pipeline (not the version's fault: no breaker,
        no auto-rollback outcome)."""
        fe = self.fe
        fe.pipeline.count_error(code, req.model, req.version)
        where = {"model": req.model, "version": req.version, "route": req.route}
        fe.reply(req.envelope, p.error_body(req.client_id, code, message, req.trace, where))

    def sweep(self, now: float) -> None:
        for key, req in self.waiting.expired(now):
            self.answer(req, p.UNAVAILABLE, cold_start_message(str(key)))

    def fail_all(self, code: str, message: str) -> int:
        n = 0
        for key in list(self.cold):
            for req in self.waiting.failed(key):
                self.answer(req, code, message)
                n += 1
        return n

    def view(self) -> dict[str, Any]:
        """``models``/``stats``/``/debug``: the budget, what is resident (LRU first) and each version's
        state, footprint (what it counts for while resident, else its last measurement; 0 until one)
        and whether it was measured, whether it is warm (not evicted for a cold load), cold loads and
        evictions."""
        versions: dict[str, dict] = {}
        now = time.monotonic()
        for name, vs in self.fe.specs.items():
            if not self.settings.get(name, PoolSetting()).lazy:
                continue
            for v in vs:
                key = f"{name}:{v}"
                versions[key] = {"state": self.state(key),
                                 "footprint_bytes": self.pool.footprint((name, v)),
                                 "footprint_measured": self.pool.is_measured((name, v)),
                                 "warm": self.pool.warm((name, v), now),
                                 "waiting": self.waiting.waiting(key),
                                 "evictions": self.evictions.get(key, 0),
                                 "last_cold_load_s": round(self.cold_loads.get(key, 0.0), 3)}
        return {"budget_bytes": self.pool.budget, "used_bytes": self.pool.used(), "warm_s": self.pool.warm_s,
                "resident_lru": [f"{n}:{v}" for n, v in self.pool.order()], "versions": versions}


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0
