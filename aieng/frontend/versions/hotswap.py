"""Hot swap, make-before-break: run-time load and unload of model versions, gated by golden sets.

The frontend orchestrates; the supervisor only records (so a restarted worker
comes up with the current set of versions); the workers build.

Load (``aieng models load MODEL VERSION``, or a new directory at reload):
  1. the directory is validated (``model_repo.load_spec``: model.yaml, the
     model file, its content hash; a malformed ``golden.json`` refuses the
     load) on a low-priority helper thread, so the loop keeps serving while a
     file of tens of MB is hashed;
  2. ``LoadVersion(spec)`` goes to the supervisor, then to the executor (it
     builds and warms the session on a thread at ``AIENG_LOAD_PRIORITY``,
     idle by default: the loop keeps batching other models) and the
     postprocess workers, and to the preprocess workers **one at a time**,
     each out of the rotation (``Workers.resting``) while it builds after the
     tasks it already had; each answers ``VersionLoaded`` or
     ``VersionFailed``.  A cold load (below) is ``urgent``: a request waits,
     so every step runs at normal priority;
  3. once every worker has it, the version's **golden set** (``golden.json``
     in its directory, docs/models.md) runs through the real pipeline as
     internal requests pinned to it, ``GOLDEN_WINDOW`` at a time (never
     routed, never counted against a client);
  4. every case within tolerance -> the version becomes *routable* (added to
     the model's versions with weight 0: set weights or promote next).  Any
     failure (a worker's build, a golden case, a timeout) leaves it
     unroutable: logged, counted (``aieng_version_loads_total{outcome}``),
     shown in ``models``/``rollout status``, and its built state released;
     the versions that served keep serving.

Unload: refused while the version has weight > 0, a rule names it, or it is
the model's last version.  It stops being routable at once (a pinned request
gets MODEL_NOT_FOUND), its requests in flight drain (each ends by its
deadline at the latest), then ``UnloadVersion`` releases it everywhere.

A version of a lazy model (``pool: {lazy: true}``) is in ``specs`` and routable
while not built (*cold*); its first request loads it through this same path
(``source="cold"``, started by ``poolctl``, which hears every ``ready`` and
``fail``).  An eviction releases it everywhere without taking its routing.

A version without ``golden.json`` becomes routable once loaded (a warning is
logged).  Versions of models the server does not serve cannot be loaded at
run time (a restart adds a model).
"""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aieng import model_repo
from aieng.frontend.requests.table import Request
from aieng.frontend.rollout import routing
from aieng.frontend.versions.golden import GOLDEN_FILE, _input, compare, read_golden  # noqa: F401 (compare: scripts)
from aieng.runtime.worker_hotswap import lower_priority
from aieng.wire import messages as m
from aieng.wire import protocol as p

if TYPE_CHECKING:  # pragma: no cover
    from aieng.frontend.server import Frontend

GOLDEN_CLIENT = b"\x00golden"  # the envelope of golden requests: answered to ``on_answer``, never a socket
LOAD_TIMEOUT_S = 300.0  # a worker that never answers a load fails it
WORKER_ROLES = ("preprocess", "executor", "postprocess")
GOLDEN_WINDOW = 2  # golden requests of one load in flight at once
log = logging.getLogger("aieng.frontend.versions.hotswap")


class HotSwapError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _without(weights: dict[str, float], version: str) -> dict[str, float]:
    return {v: w for v, w in weights.items() if v != version}


BUSY = ("validating", "loading", "golden", "draining")


@dataclass
class Load:
    """One version's run-time load (or unload), as ``models``/``rollout status`` show it."""
    name: str
    version: str
    source: str  # admin / reload
    # validating -> loading -> golden -> ready | failed;  draining -> unloaded;  pool (poolctl): cold, evicted
    state: str = "validating"
    spec: model_repo.ModelSpec | None = None
    future: Any = None  # the validation on the pool thread
    started: float = field(default_factory=time.monotonic)
    waiting: set = field(default_factory=set)  # workers that have not answered yet
    golden: dict | None = None
    pending: dict = field(default_factory=dict)  # golden request id -> case index
    error: str = ""
    seconds: float = 0.0
    at: float = field(default_factory=time.time)
    footprint: dict = field(default_factory=dict)  # worker -> its RSS growth building it (VersionLoaded)
    release_pending: bool = False  # failed with its golden requests still in flight: release once they end
    pre_queue: list = field(default_factory=list)  # preprocess workers still to build it, one at a time
    next_case: int = 0  # the next golden case to send
    pre_now: str = ""  # the preprocess worker building it now (out of the rotation meanwhile)
    body: bytes = b""  # the encoded LoadVersion

    def view(self) -> dict:
        out = {"state": self.state, "source": self.source, "at": self.at, "seconds": round(self.seconds, 3),
               "golden_cases": len(self.golden["cases"]) if self.golden else 0}
        if self.error:
            out["error"] = self.error
        if self.waiting:
            out["waiting_for"] = sorted(self.waiting)
        if self.footprint:
            out["footprint_bytes"] = dict(sorted(self.footprint.items()))
        return out


class HotSwap:
    def __init__(self, fe: "Frontend"):
        self.fe = fe
        self.loads: dict[str, Load] = {}  # "model:version" -> its last load/unload
        self.serial = 0
        self.handlers = {m.VersionLoaded: self.on_loaded, m.VersionFailed: self.on_failed}
        # validation threads: one at low priority for loads beside serving (it stays low: Linux cannot
        # raise it back), one at the loop's for cold loads, which a request waits for
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="hotswap",
                                       initializer=lower_priority, initargs=(fe.cfg.load_priority == "idle",))
        self.urgent_pool = ThreadPoolExecutor(1, thread_name_prefix="hotswap-cold")

    # -- load --------------------------------------------------------------------------
    def load(self, name: str, version: str, source: str = "admin") -> dict:
        fe = self.fe
        if name not in fe.specs:
            raise HotSwapError(p.MODEL_NOT_FOUND, f"unknown model {name!r}: only versions of served models "
                                                  f"load at run time (serving {', '.join(sorted(fe.specs))})")
        key = f"{name}:{version}"
        cur = self.loads.get(key)
        if version in fe.specs[name] and not fe.poolctl.is_cold(key):
            raise HotSwapError(p.INVALID_REQUEST, f"{key} is loaded already")
        if cur is not None and cur.state in BUSY:
            raise HotSwapError(p.INVALID_REQUEST, f"{key} is {cur.state} already")
        mdir = fe.rollout.model_dirs()[name]
        vdir = os.path.join(mdir, version)
        if not version or os.sep in version or version.startswith(".") or not os.path.isfile(
                os.path.join(vdir, "model.yaml")):
            raise HotSwapError(p.MODEL_NOT_FOUND, f"no version directory {vdir} with a model.yaml")
        if fe.poolctl.is_cold(key):  # a lazy model's version: evict to fit the budget first (or refuse)
            fe.poolctl.make_room(key)
        # Validating hashes the model file (tens of MB: 100+ ms): on a thread, so the loop keeps serving
        # (hashlib releases the GIL); ``tick`` picks the result up.
        ld = self.loads[key] = Load(name, version, source, state="validating")
        pool = self.urgent_pool if source == "cold" else self.pool
        ld.future = pool.submit(self.validate, name, version, vdir)
        log.warning("loading %s from %s (%s)", key, vdir, source)
        return {"model": name, "version": version, "load": ld.view()}

    def validate(self, name: str, version: str, vdir: str) -> tuple[model_repo.ModelSpec, dict | None]:
        # on a helper thread (``pool``, low priority: hashing a 90 MB file leaves the cores to serving)
        spec = model_repo.load_spec(name, version, vdir)
        return spec, read_golden(spec.path)

    def validated(self, ld: Load) -> None:
        fe = self.fe
        try:
            spec, golden = ld.future.result()
        except model_repo.ModelError as exc:
            return self.fail(ld, f"does not load: {exc}", release=False)
        except Exception as exc:  # an unreadable directory: this version's failure only
            return self.fail(ld, f"does not load: {type(exc).__name__}: {exc}", release=False)
        finally:
            ld.future = None
        if spec.version in fe.specs.get(spec.name, {}) and not fe.poolctl.is_cold(spec.key):
            return self.fail(ld, "loaded meanwhile", release=False)
        model_repo.apply_overrides({spec.name: {spec.version: spec}}, fe.cfg.max_batch_size,
                                   fe.cfg.max_wait_ms)
        model_wide = next(iter(fe.specs[spec.name].values())).extra
        spec.extra["routing"], spec.extra["pool"] = model_wide.get("routing"), model_wide.get("pool")
        ld.spec, ld.golden, ld.state = spec, golden, "loading"
        body = m.encode(m.LoadVersion(spec.to_dict(), urgent=ld.source == "cold"))
        fe.send_hub("supervisor", [body])  # first: a worker restarted from now on comes up with it
        ld.body = body
        for w in list(fe.workers.by_name.values()):
            if w.role == "preprocess":
                ld.pre_queue.append(w.name)
            elif w.role in WORKER_ROLES and fe.send_hub(w.name, [body]):
                ld.waiting.add(w.name)
        self.next_preprocess(ld)
        log.info("%s validated (sha256 %s; golden set: %s); building in every worker", spec.key,
                 spec.content_hash[:16], f"{len(golden['cases'])} cases" if golden else "none")
        self.advance(ld)  # no worker connected right now: each comes (back) with it from the supervisor

    def next_preprocess(self, ld: Load) -> None:
        """Preprocess workers build a version one at a time, each out of the rotation while it does (a
        tokenizer's parse holds the worker's only thread for tens of ms): the others serve meanwhile."""
        while not ld.pre_now and ld.pre_queue:
            name = ld.pre_queue.pop(0)
            if name not in self.fe.workers.by_name:
                continue  # gone: it comes back with the version from the supervisor
            self.fe.workers.resting.add(name)
            if self.fe.send_hub(name, [ld.body]):
                ld.waiting.add(name)
                ld.pre_now = name
            else:
                self.fe.workers.resting.discard(name)

    def rested(self, ld: Load, worker: str) -> None:
        """``worker`` answered (or died): it is routed to again, and the next one builds."""
        if worker and worker == ld.pre_now:
            self.fe.workers.resting.discard(worker)
            ld.pre_now = ""
            if ld.state == "loading":
                self.next_preprocess(ld)

    def on_loaded(self, msg: m.VersionLoaded, ident: bytes) -> None:
        ld = self.loads.get(msg.key)
        if ld is None or ld.state != "loading":
            return
        ld.waiting.discard(msg.worker)
        self.rested(ld, msg.worker)
        ld.footprint[msg.worker] = msg.footprint_bytes
        if msg.gpu_footprint_bytes:  # the executor's CUDA session (NVML): what the pool budgets then
            ld.footprint[f"{msg.worker}:gpu"] = msg.gpu_footprint_bytes
        self.advance(ld)

    def on_failed(self, msg: m.VersionFailed, ident: bytes) -> None:
        ld = self.loads.get(msg.key)
        if ld is not None and ld.state == "loading":
            self.fail(ld, f"{msg.worker}: {msg.error}")

    def on_worker_down(self, worker: str, code: int) -> None:
        """A worker died while a load was under way (building, or running its golden set): the load may be
        what killed it (a session over the memory limit), so it fails, and the supervisor has dropped it
        from the restart (``VersionRecord.drop_pending``): never rebuilt, never reported ready."""
        if not (worker == "executor" or worker.startswith(("pre-", "post-"))):  # not a builder (gateway)
            return
        for ld in list(self.loads.values()):
            if ld.state in ("loading", "golden"):
                self.fail(ld, f"{worker} exited (code {code}) during the load; it is not rebuilt: load it "
                          "again once the cause is fixed")

    def advance(self, ld: Load) -> None:
        if ld.waiting or ld.pre_queue or ld.state != "loading":
            return
        if ld.golden is None:
            log.warning("%s has no %s: routable without one", ld.spec.key, GOLDEN_FILE)
            self.ready(ld)
            return
        ld.state = "golden"
        self.run_golden(ld)

    def run_golden(self, ld: Load) -> None:
        """Send the golden cases, at most ``GOLDEN_WINDOW`` in flight: a version's whole golden set as
        one batch would hold the executor's lane from the models serving meanwhile."""
        fe, spec = self.fe, ld.spec
        timeout_s = (spec.timeout_ms or fe.cfg.default_timeout_ms) / 1000.0
        cases = ld.golden["cases"]
        while len(ld.pending) < GOLDEN_WINDOW and ld.next_case < len(cases):
            i, case = ld.next_case, cases[ld.next_case]
            ld.next_case += 1
            self.serial += 1
            rid_client = f"golden:{spec.key}:{self.serial}"
            inputs = {k: _input(v) for k, v in case["inputs"].items()}
            params = case.get("params") or {}
            body = p.pack({"op": "infer", "model": spec.name, "version": spec.version, "inputs": inputs,
                           "params": params})
            ld.pending[rid_client] = i
            now = time.monotonic()
            fe.pipeline.start(Request(fe.table.new_rid(), [GOLDEN_CLIENT], rid_client, spec.name,
                                      spec.version, now + timeout_s, now, params,
                                      trace=f"golden{self.serial}", body=body, route="golden",
                                      background=ld.source != "cold"))  # a cold load: a request waits
            if ld.state != "golden":  # answered at once (refused): the load failed
                return

    def on_answer(self, body: bytes) -> None:
        """The answer to a golden request (``Frontend.reply`` hands over every GOLDEN_CLIENT envelope)."""
        ans = p.unpack_limited(body, self.fe.cfg.max_message_bytes)
        rid = ans.get("id")
        ld = next((x for x in self.loads.values() if rid in x.pending), None)
        if ld is None or ld.state != "golden":
            return
        case = ld.pending.pop(rid)
        if not ans.get("ok"):
            err = ans.get("error") or {}
            return self.fail(ld, f"golden case {case}: {err.get('code')}: {err.get('message')}")
        why = compare(ld.golden, ld.golden["cases"][case]["expected"], ans.get("outputs") or {})
        if why is not None:
            return self.fail(ld, f"golden case {case}: {why}")
        self.run_golden(ld)
        if not ld.pending:
            self.ready(ld)

    def ready(self, ld: Load) -> None:
        fe, spec = self.fe, ld.spec
        fe.specs[spec.name][spec.version] = spec  # the rollout model shares this dict: pinnable now
        model = fe.rollout.models[spec.name]
        model.versions.add(spec.version)  # routable: weights and rules may name it (weight 0 until then)
        ld.state, ld.seconds = "ready", time.monotonic() - ld.started
        fe.send_hub("supervisor", [m.encode(m.LoadVersion(spec.to_dict(), ready=True))])  # no longer pending
        model.event("loaded", version=spec.version, reason=f"loaded ({ld.source}), golden set "
                    + (f"passed ({len(ld.golden['cases'])} cases)" if ld.golden else "absent")
                    + f" in {ld.seconds:.1f}s")
        fe.rollout.save()
        fe.metrics.version_load(spec.name, spec.version, "ok")
        log.warning("%s is routable (loaded in %.2fs; weight 0 until set)", spec.key, ld.seconds)
        fe.poolctl.on_ready(ld)  # a cold load's waiting requests go on their way

    def fail(self, ld: Load, why: str, release: bool = True) -> None:
        fe, key = self.fe, f"{ld.name}:{ld.version}"
        ld.state, ld.error, ld.seconds = "failed", why[:500], time.monotonic() - ld.started
        ld.pending.clear()
        ld.waiting.clear()
        ld.pre_queue.clear()
        self.rested(ld, ld.pre_now)  # routed to again (state is failed: no next one)
        model = fe.rollout.models.get(ld.name)
        if model is not None:
            model.event("load_failed", version=ld.version, reason=ld.error)
        fe.metrics.version_load(ld.name, ld.version, "failed")
        log.error("loading %s failed, it stays unroutable: %s", key, ld.error)
        if release and fe.table.per_model().get(key, 0):
            ld.release_pending = True  # other golden cases are still running there: tick releases it
        elif release:
            self.release(key)
        fe.poolctl.on_failed(ld)  # a cold load's waiting requests get UNAVAILABLE with the reason

    def busy(self, key: str) -> bool:
        ld = self.loads.get(key)
        return ld is not None and ld.state in BUSY

    def release(self, key: str) -> None:
        name, _, version = key.partition(":")
        # a version still served (cold, or evicted by the pool) is kept by the supervisor as cold
        body = m.encode(m.UnloadVersion(key, evict=version in self.fe.specs.get(name, {})))
        for w in list(self.fe.workers.by_name.values()):
            if w.role in WORKER_ROLES:
                self.fe.send_hub(w.name, [body])
        self.fe.send_hub("supervisor", [body])

    # -- unload -------------------------------------------------------------------------
    def unload(self, name: str, version: str, source: str = "admin") -> dict:
        fe = self.fe
        model = fe.rollout.models.get(name)
        if model is None:
            raise HotSwapError(p.MODEL_NOT_FOUND, f"unknown model {name!r}")
        key = f"{name}:{version}"
        if version not in fe.specs[name]:
            raise HotSwapError(p.MODEL_NOT_FOUND, f"model {name!r} has no loaded version {version!r}")
        state = model.state
        if len(fe.specs[name]) == 1:
            raise HotSwapError(p.INVALID_REQUEST, f"{key} is the model's last version")
        if state.weights.get(version, 0) > 0:
            raise HotSwapError(p.INVALID_REQUEST, f"{key} has weight {state.weights[version]:g}%: set it to "
                                                  f"0 first (aieng rollout set-weights); nothing changed")
        named = [r.name for r in state.rules if r.version == version]
        if named:
            raise HotSwapError(p.INVALID_REQUEST, f"{key} is named by rules {named}: change them first; "
                                                  f"nothing changed")
        spec = fe.specs[name].pop(version)  # no longer pinnable
        model.versions.discard(version)
        model.state = routing.build(state, model.versions, _without(state.weights, version),
                                    reason=state.reason)
        # an old routing that sends traffic to it can no longer be rolled back to
        model.history = [s for s in model.history if not s.weights.get(version)
                         and all(r.version != version for r in s.rules)]
        model.history = [routing.build(s, model.versions, _without(s.weights, version), reason=s.reason)
                         for s in model.history]
        model.event("unloading", version=version, reason=f"unload ({source}): draining")
        fe.rollout.save()
        ld = self.loads[key] = Load(name, version, source, state="draining", spec=spec)
        fe.poolctl.on_unloaded(key)
        in_flight = fe.table.per_model().get(key, 0)
        log.warning("unloading %s (%s): draining %d requests", key, source, in_flight)
        self.tick(time.monotonic())
        return {"model": name, "version": version, "load": ld.view(), "in_flight": in_flight}

    def tick(self, now: float) -> None:
        """Finish drains whose requests are all answered; fail loads a worker never answered."""
        in_flight = None
        for key, ld in self.loads.items():
            if ld.state == "draining":
                in_flight = self.fe.table.per_model() if in_flight is None else in_flight
                if in_flight.get(key, 0) == 0:
                    self.release(key)
                    ld.state, ld.seconds = "unloaded", now - ld.started
                    model = self.fe.rollout.models[ld.name]
                    model.event("unloaded", version=ld.version, reason=f"drained in {ld.seconds:.2f}s")
                    log.warning("unloaded %s (drained in %.2fs)", key, ld.seconds)
            elif ld.release_pending:
                in_flight = self.fe.table.per_model() if in_flight is None else in_flight
                if in_flight.get(key, 0) == 0:
                    ld.release_pending = False
                    self.release(key)
            elif ld.state == "validating" and ld.future is not None and ld.future.done():
                self.validated(ld)
            elif ld.state == "loading" and now - ld.started > LOAD_TIMEOUT_S:
                self.fail(ld, f"no answer from {', '.join(sorted(ld.waiting))} within {LOAD_TIMEOUT_S:.0f}s")

    # -- reload: the repository's directories ------------------------------------------------
    def rescan(self) -> dict[str, list[str]]:
        """New version directories the policy serves are loaded; versions whose directory is gone are
        unloaded (when nothing routes to them: else logged and kept).  Returns what was started."""
        fe = self.fe
        started: dict[str, list[str]] = {"loading": [], "unloading": [], "kept": []}
        for name, mdir in fe.rollout.model_dirs().items():
            try:
                found = [v for v in sorted(os.listdir(mdir), key=model_repo._version_key)
                         if os.path.isfile(os.path.join(mdir, v, "model.yaml"))]
                served = model_repo.apply_policy(model_repo.model_settings(mdir).get("versions"), found,
                                                 os.path.join(mdir, "model.yaml"))
            except (OSError, model_repo.ModelError) as exc:
                log.error("reload: %s not rescanned: %s", name, exc)
                continue
            busy = {ld.version for ld in self.loads.values() if ld.name == name and ld.state in BUSY}
            for v in served:
                if v not in fe.specs[name] and v not in busy:
                    try:
                        self.load(name, v, "reload")
                        started["loading"].append(f"{name}:{v}")
                    except HotSwapError as exc:
                        log.error("reload: %s", exc.message)
            for v in list(fe.specs[name]):
                if v not in found:
                    try:
                        self.unload(name, v, "reload")
                        started["unloading"].append(f"{name}:{v}")
                    except HotSwapError as exc:
                        log.error("reload: directory of %s:%s is gone but it stays: %s", name, v, exc.message)
                        started["kept"].append(f"{name}:{v}")
        return started

    def view(self) -> dict[str, dict]:
        return {k: ld.view() for k, ld in self.loads.items()}
