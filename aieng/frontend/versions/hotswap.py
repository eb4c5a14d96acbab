"""Hot swap, make-before-break: run-time load and unload of model versions, gated by golden sets
(docs/rollout.md, section 9, has the procedure and its measurements).

Load: the directory is validated on a low-priority helper thread; ``LoadVersion`` goes to the supervisor
(which records it), the executor, the postprocess workers and the preprocess workers one at a time (each
out of the rotation while it builds); once all answered ``VersionLoaded``, the golden set runs through
the real pipeline; every case within tolerance makes the version routable at weight 0.  Any failure
leaves it unroutable (logged, counted, shown) and releases what was built.  A cold load (``poolctl``) is
the same path, urgent.  Unload: refused while routed to; unroutable at once, drained, then released.
Reload: ``rescan.py`` turns new and removed directories into loads and unloads.
"""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from aieng import model_repo
from aieng.frontend.requests.table import Request
from aieng.frontend.rollout import routing
from aieng.frontend.versions.golden import GOLDEN_FILE, _input, compare, read_golden  # noqa: F401 (compare: scripts)
from aieng.frontend.versions.load import BUSY, Load, _without
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
            raise p.RequestError(p.MODEL_NOT_FOUND, f"unknown model {name!r}: only versions of served models "
                                                  f"load at run time (serving {', '.join(sorted(fe.specs))})")
        key = f"{name}:{version}"
        cur = self.loads.get(key)
        if version in fe.specs[name] and not fe.poolctl.is_cold(key):
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is loaded already")
        if cur is not None and cur.state in BUSY:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is {cur.state} already")
        mdir = fe.rollout.model_dirs()[name]
        vdir = os.path.join(mdir, version)
        if not version or os.sep in version or version.startswith(".") or not os.path.isfile(
                os.path.join(vdir, "model.yaml")):
            raise p.RequestError(p.MODEL_NOT_FOUND, f"no version directory {vdir} with a model.yaml")
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
            raise p.RequestError(p.MODEL_NOT_FOUND, f"unknown model {name!r}")
        key = f"{name}:{version}"
        if version not in fe.specs[name]:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"model {name!r} has no loaded version {version!r}")
        state = model.state
        if len(fe.specs[name]) == 1:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is the model's last version")
        if state.weights.get(version, 0) > 0:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} has weight {state.weights[version]:g}%: set "
                                 "it to 0 first (aieng rollout set-weights); nothing changed")
        named = [r.name for r in state.rules if r.version == version]
        if named:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is named by rules {named}: change them first; "
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

    def view(self) -> dict[str, dict]:
        return {k: ld.view() for k, ld in self.loads.items()}
