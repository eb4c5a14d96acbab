"""Model pool, wired: lazy versions load on their first request; LRU eviction under a memory budget.

The rules are pure (``pool.py``); this module feeds them the frontend's events and acts on the answers
through the hot swap path, so a lazily loaded version is built, warmed and golden-checked exactly like an
``aieng models load``.  A version of a lazy model is resident, loading, evicted or cold.  ``start`` holds
a request for a version that is not resident (bounded per version, fairly between its clients:
``ColdStarts.make_place``; checked first by ``inputs.precheck`` so a bad request never loads or evicts)
and starts its load; ``make_room`` evicts the least recently used idle versions outside their warm
period, or refuses the load naming the budget; ``on_ready`` dispatches
the waiters, ``on_failed`` answers them UNAVAILABLE, ``sweep`` answers those past their deadline.  Each
waiter gets exactly one answer.  docs/rollout.md (section 10) has the states, the footprint rules and
the settings.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Protocol

from aieng.config import Config
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.requests.table import Request
from aieng.frontend.versions.load import Load, LoadBook
from aieng.frontend.versions.pool import ColdStarts, Pool, cold_start_message, refusal
from aieng.inputs import precheck
from aieng.models.served import ServedVersions
from aieng.models.settings import PoolSetting
from aieng.wire import protocol as p

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


class Loader(Protocol):
    """What the pool asks of the hot swap path (``manager.VersionManager``)."""

    def load(self, name: str, version: str, source: str = "admin") -> dict: ...

    def release(self, key: str) -> None: ...


class PoolControl:
    def __init__(self, cfg: Config, specs: ServedVersions, loads: LoadBook, loader: Loader,
                 start: Callable[[Request], None], per_model: Callable[[], dict[str, int]], metrics: Metrics,
                 refuse: Callable[[Request, str, str], None]):
        """``start`` dispatches a request; ``per_model`` counts requests in flight by ``model:version``;
        ``refuse(req, code, message)`` answers a request that never entered the pipeline."""
        self.specs, self.loads, self.loader, self.start_request = specs, loads, loader, start
        self.per_model, self.metrics, self.refuse = per_model, metrics, refuse
        self.pool = Pool(cfg.model_memory_budget, cfg.pool_warm_s, cfg.pool_remeasure_s)
        self.waiting: ColdStarts[Request] = ColdStarts(cfg.max_inflight)
        self.settings = {name: next(iter(vs.values())).pool for name, vs in specs.items()}  # model-wide
        self.cold = {k for k in cfg.cold_versions if _pair(k)[1] in specs.versions_of(_pair(k)[0])}
        self.evictions: dict[str, int] = {}
        self.cold_loads: dict[str, float] = {}  # key -> seconds of its last cold load
        self.refused: dict[str, tuple[float, int]] = {}  # key -> (when last logged, refusals since)
        for key in sorted(self.cold):
            loads.put(key, Load(*_pair(key), "pool", state="cold"))
        for name, vs in specs.items():  # resident now (eager, or lazy and loaded before a restart)
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
        if self.loads.busy(key):
            return "loading"
        ld = self.loads.get(key)
        return "evicted" if ld is not None and ld.state == "evicted" else "cold"

    def estimate(self, pk: tuple[str, str], now: float) -> int:
        """A load's bytes: its last measured footprint (``Pool.need``), else the largest measured within
        the budget of its model's other versions (usually one architecture), else its model file's size."""
        siblings = [self.pool.measured((pk[0], v)) for v in self.specs.versions_of(pk[0]) if v != pk[1]]
        default = max([_file_size(self.specs.get(*pk).onnx_path)] + siblings)
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
            self.start_request(req)
            return True
        try:
            precheck(self.specs[req.model][req.version], inputs)
        except p.RequestError as exc:
            self.answer(req, exc.code, exc.message)
            return False
        if not self.waiting.add(key, req.deadline, req, req.client):
            full = (f"model {key} is loading (cold start) and {self.waiting.max_waiting} requests wait for "
                    "it already")
            bumped = self.waiting.make_place(key, req.client)  # a client holding many gives one place up
            if bumped is None:
                self.answer(req, p.OVERLOADED, full)
                return False
            self.answer(bumped, p.OVERLOADED, full)
            self.waiting.add(key, req.deadline, req, req.client)
        if not self.loads.busy(key):
            self.begin_load(key)
        return False

    def begin_load(self, key: str) -> None:
        try:
            self.loader.load(*_pair(key), source="cold")  # which makes room first (make_room)
        except p.RequestError as exc:
            self.release_waiters(key, p.UNAVAILABLE,
                                 f"model {key} cannot be loaded (cold start): {exc.message}")

    def make_room(self, key: str) -> None:
        """Before any load of a cold version (a request's, or ``aieng models load``): evict what the
        plan says and reserve the load's estimate, or raise ``protocol.RequestError`` naming the budget."""
        pk, now = _pair(key), time.monotonic()
        need = self.estimate(pk, now)
        self.pool.set_inflight({_pair(k): n for k, n in self.per_model().items()})
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
        pk = _pair(key)
        self.pool.unloaded(pk)
        prev = self.loads.get(key)
        self.loader.release(key)
        self.loads.put(key, Load(*pk, "pool", state="evicted",
                                 footprint=dict(prev.footprint) if prev is not None else {}))
        self.cold.add(key)
        self.evictions[key] = self.evictions.get(key, 0) + 1
        self.metrics.eviction(*pk)
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
            self.metrics.cold_load(ld.name, ld.version, ld.seconds)
        now = time.monotonic()
        for req in self.waiting.ready(key):
            if req.deadline <= now:
                self.answer(req, p.UNAVAILABLE, cold_start_message(key))
            else:
                self.pool.touch(pk, now)
                self.start_request(req)

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
        self.refuse(req, code, message)

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
        for name, vs in self.specs.items():
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
