"""Hot swap, make-before-break: run-time load and unload of model versions, gated by golden sets.

Load: the directory is validated on a low-priority thread; ``LoadVersion`` goes to the supervisor, the
executor, the postprocess workers and the preprocess workers one at a time (each out of the rotation while
it builds); once every one answered, the golden set runs through the real pipeline, and a version whose
every case is within tolerance becomes routable at weight 0.  Any failure leaves it unroutable and
releases what was built.  A model the start left out (``Config.left_out``) loads the same way, read
from the repository with its model-wide settings; its first version takes its traffic (the model's routing
as at a start) and it is no longer failed.  Unload: refused while routed to; unroutable at once, drained,
then released.  A cold load of the pool is the same path, urgent.  docs/rollout.md (section 9) has the
procedure and its measurements.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Protocol

from aieng.config import Config
from aieng.frontend.control.workers import Workers
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.requests.table import GOLDEN, Golden, Request, RequestTable
from aieng.frontend.rollout.rollout import Rollout
from aieng.frontend.versions.golden import _input, compare
from aieng.frontend.versions.load import BUSY, Load, LoadBook
from aieng.models import repo as model_repo
from aieng.models.golden import GOLDEN_FILE, read_golden
from aieng.models.served import ServedVersions, VersionsWriter
from aieng.runtime.worker_hotswap import lower_priority
from aieng.wire import messages as m
from aieng.wire import protocol as p

LOAD_TIMEOUT_S = 300.0  # a worker that never answers a load fails it
WORKER_ROLES = ("preprocess", "executor", "postprocess")
GOLDEN_WINDOW = 2  # golden requests of one load in flight at once
log = logging.getLogger("aieng.frontend.versions.hotswap")


class PoolHooks(Protocol):
    """What a load tells the model pool (``poolctl.PoolControl``)."""

    def is_cold(self, key: str) -> bool: ...

    def make_room(self, key: str) -> None: ...

    def on_ready(self, ld: Load) -> None: ...

    def on_failed(self, ld: Load) -> None: ...

    def on_unloaded(self, key: str) -> None: ...


class HotSwap:
    def __init__(self, cfg: Config, specs: ServedVersions, writer: VersionsWriter,
                 hub: Callable[[str, list], bool], workers: Workers, rollout: Rollout,
                 start: Callable[[Request], None], table: RequestTable, metrics: Metrics, loads: LoadBook,
                 pool: PoolHooks):
        """``specs`` is read, ``writer`` (its one writer, the version manager's) adds and removes versions;
        ``hub(worker, frames)`` sends to a worker or the supervisor; ``start`` hands a golden request to
        the pipeline; ``loads`` is shared with the pool, which records its cold and evicted versions."""
        self.cfg, self.specs, self.hub, self.workers, self.rollout = cfg, specs, hub, workers, rollout
        self.writer = writer
        self.start, self.table, self.metrics, self.loads, self.pool = start, table, metrics, loads, pool
        self.serial = 0
        self.handlers = {m.VersionLoaded: self.on_loaded, m.VersionFailed: self.on_failed}
        # validation threads: one at low priority for loads beside serving (it stays low: Linux cannot
        # raise it back), one at the loop's for cold loads, which a request waits for
        idle = cfg.load_priority == "idle"
        self.pool_thread = ThreadPoolExecutor(1, thread_name_prefix="hotswap", initializer=lower_priority,
                                              initargs=(idle,))
        self.urgent_pool = ThreadPoolExecutor(1, thread_name_prefix="hotswap-cold")

    # -- load --------------------------------------------------------------------------
    def load(self, name: str, version: str, source: str = "admin", config: str | None = None) -> dict:
        specs = self.specs
        new = name not in specs and name in self.workers.left_out_models()  # the start left it out
        if name not in specs and not new:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"unknown model {name!r}: only versions of served models "
                                                  f"load at run time (serving {', '.join(sorted(specs))})")
        key = f"{name}:{version}"
        cur = self.loads.get(key)
        if version in specs.versions_of(name) and not self.pool.is_cold(key):
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is loaded already")
        if cur is not None and cur.state in BUSY:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is {cur.state} already")
        mdir = os.path.join(self.cfg.model_repository, name) if new else self.rollout.model_dirs()[name]
        vdir = os.path.join(mdir, version)
        described = model_repo.describes(vdir) or (version.isdigit() and os.path.isdir(vdir) and (
            config is not None or os.path.isfile(os.path.join(os.path.dirname(vdir), "config.pbtxt"))))
        if not version or os.sep in version or version.startswith(".") or not described:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"no version directory {vdir} with a model.yaml "
                                                    "or an ONNX file (or a config.pbtxt beside it)")
        if config is not None and os.path.isfile(os.path.join(vdir, "model.yaml")):
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is described by its model.yaml: a config "
                                                    "override applies to a config.pbtxt model's versions")
        if self.pool.is_cold(key):  # a lazy model's version: evict to fit the budget first (or refuse)
            self.pool.make_room(key)
        # Validating hashes the model file (tens of MB: 100+ ms): on a thread, so the loop keeps serving
        # (hashlib releases the GIL); ``tick`` picks the result up.
        ld = self.loads.put(key, Load(name, version, source, state="validating"))
        pool = self.urgent_pool if source == "cold" else self.pool_thread
        ld.future = pool.submit(self.validate, name, version, vdir, config, self.cfg.allow_model_code)
        log.warning("loading %s from %s (%s)", key, vdir, source)
        return {"model": name, "version": version, "load": ld.view()}

    @staticmethod
    def validate(name: str, version: str, vdir: str, config: str | None = None, allow_code: bool = False
                 ) -> tuple[model_repo.ModelSpec, dict | None]:
        # on a helper thread (low priority: hashing a 90 MB file leaves the cores to serving); a version
        # without a model.yaml is described by its model's config.pbtxt (or the load's ``config`` override),
        # else by its graph
        triton = model_repo.triton_model(os.path.dirname(vdir), config)
        spec = model_repo.version_spec(name, version, vdir, triton, allow_code)
        return spec, read_golden(spec.path)

    def validated(self, ld: Load) -> None:
        new = ld.name not in self.specs  # a model the start left out: its model-wide settings read here
        try:
            spec, golden = ld.future.result()
            spec = model_repo.with_model_wide(spec) if new else spec
        except model_repo.ModelError as exc:
            return self.fail(ld, f"does not load: {exc}", release=False)
        except Exception as exc:  # an unreadable directory: this version's failure only
            return self.fail(ld, f"does not load: {type(exc).__name__}: {exc}", release=False)
        finally:
            ld.future = None
        if self.specs.get(spec.name, spec.version) is not None and not self.pool.is_cold(spec.key):
            return self.fail(ld, "loaded meanwhile", release=False)
        model_wide = spec if new else next(iter(self.specs[spec.name].values()))  # routing and pool
        spec = dataclasses.replace(model_repo.overridden(spec, self.cfg.max_batch_size, self.cfg.max_wait_ms),
                                   routing=model_wide.routing, pool=model_wide.pool)
        ld.spec, ld.golden, ld.state = spec, golden, "loading"
        body = m.encode(m.LoadVersion(spec, urgent=ld.source == "cold"))
        self.hub("supervisor", [body])  # first: a worker restarted from now on comes up with it
        ld.body = body
        for name, role in self.workers.names(WORKER_ROLES):
            if role == "preprocess":
                ld.pre_queue.append(name)
            elif self.hub(name, [body]):
                ld.waiting.add(name)
        self.next_preprocess(ld)
        log.info("%s validated (sha256 %s; golden set: %s); building in every worker", spec.key,
                 spec.content_hash[:16], f"{len(golden['cases'])} cases" if golden else "none")
        self.advance(ld)  # no worker connected right now: each comes (back) with it from the supervisor

    def next_preprocess(self, ld: Load) -> None:
        """Preprocess workers build a version one at a time, each out of the rotation while it does (a
        tokenizer's parse holds the worker's only thread for tens of ms): the others serve meanwhile."""
        while not ld.pre_now and ld.pre_queue:
            name = ld.pre_queue.pop(0)
            if not self.workers.connected(name):
                continue  # gone: it comes back with the version from the supervisor
            self.workers.rest(name)
            if self.hub(name, [ld.body]):
                ld.waiting.add(name)
                ld.pre_now = name
            else:
                self.workers.wake(name)

    def rested(self, ld: Load, worker: str) -> None:
        """``worker`` answered (or died): it is routed to again, and the next one builds."""
        if worker and worker == ld.pre_now:
            self.workers.wake(worker)
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
        for ld in self.loads.all():
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
        spec = ld.spec
        timeout_s = (spec.timeout_ms or self.cfg.default_timeout_ms) / 1000.0
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
            # its answer comes back to ``on_answer`` (``answers`` sends a golden case's to its ``Golden``);
            # a cold load's cases run on the serving lane: a request waits for them
            golden = Golden(self.on_answer, background=ld.source != "cold")
            self.start(Request(self.table.new_rid(), None, rid_client, spec.name, spec.version,
                               now + timeout_s, now, params, trace=f"golden{self.serial}", body=body,
                               route="golden", kind=GOLDEN, link=golden))
            if ld.state != "golden":  # answered at once (refused): the load failed
                return

    def on_answer(self, body: bytes) -> None:
        """The answer to a golden request, packed as a client's would be (``Golden.answer``)."""
        ans = p.unpack_limited(body, self.cfg.max_message_bytes)
        ld = self.loads.owner_of(ans.get("id"))
        if ld is None or ld.state != "golden":
            return
        case = ld.pending.pop(ans.get("id"))
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
        spec = ld.spec
        self.writer.add(spec)  # the rollout model reads the served versions: pinnable now
        ld.state, ld.seconds = "ready", time.monotonic() - ld.started
        self.hub("supervisor", [m.encode(m.LoadVersion(spec, ready=True))])  # no longer pending
        golden = f"passed ({len(ld.golden['cases'])} cases)" if ld.golden else "absent"
        reason = f"loaded ({ld.source}), golden set {golden} in {ld.seconds:.1f}s"
        if self.rollout.model(spec.name) is None:  # a model the start left out: served from now on
            self.rollout.add_model(spec.name, self.specs.versions_of(spec.name), reason)
            self.workers.now_served(spec.name)
        else:  # routable: weights and rules may name it (weight 0 until then)
            self.rollout.add_version(spec.name, spec.version, reason=reason)
        self.metrics.version_load(spec.name, spec.version, "ok")
        log.warning("%s is routable (loaded in %.2fs; weight 0 until set)", spec.key, ld.seconds)
        self.pool.on_ready(ld)  # a cold load's waiting requests go on their way

    def fail(self, ld: Load, why: str, release: bool = True) -> None:
        key = f"{ld.name}:{ld.version}"
        ld.state, ld.error, ld.seconds = "failed", why[:500], time.monotonic() - ld.started
        ld.pending.clear()
        ld.waiting.clear()
        ld.pre_queue.clear()
        self.rested(ld, ld.pre_now)  # routed to again (state is failed: no next one)
        self.rollout.event(ld.name, "load_failed", version=ld.version, reason=ld.error)
        self.metrics.version_load(ld.name, ld.version, "failed")
        log.error("loading %s failed, it stays unroutable: %s", key, ld.error)
        if release and self.table.per_model().get(key, 0):
            ld.release_pending = True  # other golden cases are still running there: tick releases it
        elif release:
            self.release(key)
        self.pool.on_failed(ld)  # a cold load's waiting requests get UNAVAILABLE with the reason

    def release(self, key: str) -> None:
        name, _, version = key.partition(":")
        # a version still served (cold, or evicted by the pool) is kept by the supervisor as cold
        body = m.encode(m.UnloadVersion(key, evict=version in self.specs.versions_of(name)))
        for worker, _role in self.workers.names(WORKER_ROLES):
            self.hub(worker, [body])
        self.hub("supervisor", [body])

    # -- unload -------------------------------------------------------------------------
    def unload(self, name: str, version: str, source: str = "admin") -> dict:
        if name not in self.specs:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"unknown model {name!r}")
        key = f"{name}:{version}"
        if version not in self.specs[name]:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"model {name!r} has no loaded version {version!r}")
        if len(self.specs[name]) == 1:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is the model's last version")
        self.rollout.remove_version(name, version, reason=f"unload ({source}): draining")  # or refused
        spec = self.writer.remove(name, version)  # no longer pinnable
        ld = self.loads.put(key, Load(name, version, source, state="draining", spec=spec))
        self.pool.on_unloaded(key)
        in_flight = self.table.per_model().get(key, 0)
        log.warning("unloading %s (%s): draining %d requests", key, source, in_flight)
        self.tick(time.monotonic())
        return {"model": name, "version": version, "load": ld.view(), "in_flight": in_flight}

    def tick(self, now: float) -> None:
        """Finish drains whose requests are all answered; fail loads a worker never answered."""
        in_flight = None
        for key, ld in self.loads.items():
            if ld.state == "draining":
                in_flight = self.table.per_model() if in_flight is None else in_flight
                if in_flight.get(key, 0) == 0:
                    self.release(key)
                    ld.state, ld.seconds = "unloaded", now - ld.started
                    self.rollout.event(ld.name, "unloaded", version=ld.version,
                                       reason=f"drained in {ld.seconds:.2f}s")
                    log.warning("unloaded %s (drained in %.2fs)", key, ld.seconds)
            elif ld.release_pending:
                in_flight = self.table.per_model() if in_flight is None else in_flight
                if in_flight.get(key, 0) == 0:
                    ld.release_pending = False
                    self.release(key)
            elif ld.state == "validating" and ld.future is not None and ld.future.done():
                self.validated(ld)
            elif ld.state == "loading" and now - ld.started > LOAD_TIMEOUT_S:
                self.fail(ld, f"no answer from {', '.join(sorted(ld.waiting))} within {LOAD_TIMEOUT_S:.0f}s")

    def close(self) -> None:
        self.pool_thread.shutdown(wait=False, cancel_futures=True)
        self.urgent_pool.shutdown(wait=False, cancel_futures=True)
