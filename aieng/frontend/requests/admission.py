"""Admission: a client's ``infer`` map becomes a typed request, an immediate answer, or a refusal.

Checks, in order (the first that fails answers the request with its code):
  1. shape of the request: model, inputs, params, routing_key (INVALID_REQUEST / MODEL_NOT_FOUND; a model
     the start left out, ``Config.left_out``, is UNAVAILABLE saying why); then
     routing (``rollout``) picks the version and says why (``route``): a pinned version the model refuses
     is INVALID_REQUEST, an unknown one MODEL_NOT_FOUND; then timeout_ms; a version that failed to load
     is UNAVAILABLE with its error;
  2. serving state: not ready yet or draining (UNAVAILABLE);
  3. fairness: this client's requests in flight (``per_client_inflight``; a client is what
     ``clients.owner_of`` says: an OIP principal, a CURVE key, else a connection), then everyone's
     (``max_inflight``, shadow copies not counted): OVERLOADED;
  4. response cache (a hit is answered at once, even while shedding);
  5. degradation level 3: the model's fallback answer, or OVERLOADED;
  6. the model's circuit breaker (UNAVAILABLE while open).
What passes gets its trace (``trace_of``: a valid ``traceparent`` joins the caller's, else the client's
``trace_id`` or a fresh id) and sampling decision, and an image its pixel count from the header (what
the direct route weighs it by).  Nothing here blocks or does a worker's work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aieng.config import Config
from aieng.frontend.control.lifecycle import Lifecycle
from aieng.frontend.observe.tracing import TraceCtx, Tracing
from aieng.frontend.requests.breaker import Breakers
from aieng.frontend.requests.cache import ResponseCache, cache_key
from aieng.frontend.requests.degrade import Degrader
from aieng.frontend.requests.table import RequestTable
from aieng.frontend.rollout.rollout import Rollout
from aieng.inputs import direct_image_pixels
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p
from aieng.wire import traceparent as tp


@dataclass(slots=True)
class Admitted:
    model: str
    version: str
    deadline: float
    params: dict
    trace: str
    probe: bool
    cache_key: bytes | None
    degraded: int
    route: str = "weight"
    tctx: TraceCtx | None = None
    # an image version's request: its header's pixels, 0 for a PNG (``inputs.direct_image_pixels``)
    pixels: int | None = None


@dataclass(slots=True)
class Immediate:
    """Answered without the pipeline: a cache hit or a degradation fallback."""
    model: str
    version: str
    outputs: bytes  # packed outputs map
    extra: dict  # carries "route" too
    tctx: TraceCtx | None = None


class Admission:
    def __init__(self, cfg: Config, specs: ServedVersions, rollout: Rollout,
                 table: RequestTable, breakers: Breakers, cache: ResponseCache, degrader: Degrader,
                 life: Lifecycle, tracing: Tracing | None = None):
        self.cfg, self.specs, self.rollout = cfg, specs, rollout
        self.tracing = tracing if tracing is not None else Tracing()  # disabled: ids only
        self.table, self.breakers, self.cache, self.degrader = table, breakers, cache, degrader
        self.life = life  # started, draining
        self.failed_models: dict[str, str] = {}  # "model:version" -> load error (from the workers' hellos)
        self.left_out = {lo.name: lo.error for lo in cfg.left_out}  # name -> why the start left it out

    def set_failed(self, failed: dict[str, str]) -> None:
        """Versions some worker could not load (refused UNAVAILABLE), as the workers last said."""
        self.failed_models = failed

    def refuses(self, key: str) -> bool:
        """Whether a request for version ``key`` would be refused now: it failed to load, or draining."""
        return key in self.failed_models or self.life.draining

    def resolve(self, req: dict) -> str:
        """The model a request names (MODEL_NOT_FOUND when unknown)."""
        model = req.get("model")
        if not isinstance(model, str):
            raise p.RequestError(p.INVALID_REQUEST, "'model' must be a string")
        if model not in self.specs:
            why = self.left_out.get(model)
            if why is not None:  # in the repository, but its description did not load at the start
                raise p.RequestError(p.UNAVAILABLE, f"model {model} is not loaded: {why}")
            raise p.RequestError(p.MODEL_NOT_FOUND, f"unknown model {model!r}")
        return model

    def admit(self, req: dict, client: bytes | str, received: float) -> Admitted | Immediate:
        model = self.resolve(req)
        if not isinstance(req.get("inputs"), dict):
            raise p.RequestError(p.INVALID_REQUEST, "'inputs' must be a map")
        params = req.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
            raise p.RequestError(p.INVALID_REQUEST, "'params' must be a map with string keys")
        version, route = self.rollout.route(model, req, params, p.routing_key(req))
        spec = self.specs[model][version]
        cap = self.cfg.max_timeout_ms
        timeout_ms = req.get("timeout_ms", min(spec.timeout_ms or self.cfg.default_timeout_ms, cap))
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not 0 < timeout_ms <= cap:
            raise p.RequestError(p.INVALID_REQUEST, f"'timeout_ms' must be an int in 1..{cap}")
        failed = self.failed_models.get(spec.key)
        if failed is not None:
            raise p.RequestError(p.UNAVAILABLE, f"model {spec.key} is not loaded: {failed}")
        if self.life.draining:
            raise p.RequestError(p.UNAVAILABLE, "server is shutting down")
        if not self.life.started:
            raise p.RequestError(p.UNAVAILABLE, "server is not ready yet")
        mine = self.table.client_load(client)
        if mine >= self.cfg.per_client_inflight:
            raise p.RequestError(p.OVERLOADED, f"this client has {mine} requests in flight (the per-client "
                                               f"limit); wait for answers before sending more")
        primaries = len(self.table) - self.table.shadows  # shadow copies never take a primary's place
        if primaries >= self.cfg.max_inflight:
            raise p.RequestError(p.OVERLOADED, f"{primaries} requests in flight; try again later")
        trace, tctx = self.trace_of(req)
        key = None
        if self.cache.enabled:  # a hit costs nothing: served even when shedding or a breaker is open
            key = cache_key(model, version, req["inputs"], params)
            hit = self.cache.get(key)
            if hit is not None:
                return Immediate(model, version, hit, {"batch": 0, "cached": True, "route": route}, tctx)
        level = self.degrader.level(spec.key)
        if level >= 3:  # the cache had nothing: the configured fallback, or shed
            fallback = self.degrader.fallback(spec.key)
            if fallback is None:
                raise p.RequestError(p.OVERLOADED, f"{spec.key} is degraded (level 3): shedding load")
            return Immediate(model, version, p.pack(fallback),
                             {"batch": 0, "degraded": 3, "fallback": True, "route": route}, tctx)
        allowed, probe, why = self.breakers.allow(spec.key, received)
        if not allowed:
            self.rollout.observe(model, version, p.UNAVAILABLE, 0.0)  # the routed version's fault
            raise p.RequestError(p.UNAVAILABLE, why)
        return Admitted(model, version, received + timeout_ms / 1000.0, params, trace, probe, key, level,
                        route, tctx, direct_image_pixels(spec, req["inputs"]))

    def trace_of(self, req: dict) -> tuple[str, TraceCtx]:
        """The request's trace id for logs and its trace context (module doc); never an error."""
        parent = tp.parse(req.get("traceparent"))
        if parent is not None:
            trace = parent.trace_id
        else:
            trace = req.get("trace_id")
            if not (isinstance(trace, str) and 0 < len(trace) <= 64 and trace.isprintable()):
                trace = tp.new_trace_id()
        state = tp.parse_state(req.get("tracestate")) if parent is not None else ""
        return trace, self.tracing.begin(parent, trace, state)

    @staticmethod
    def labels_of(req: Any, specs: ServedVersions) -> tuple[str, str]:
        """Model/version labels for counting a refusal: only names we serve (bounded label sets)."""
        if not isinstance(req, dict):
            return "", ""
        model, version = req.get("model"), req.get("version")
        model = model if isinstance(model, str) and model in specs else ""
        version = version if model and isinstance(version, str) and version in specs[model] else ""
        return model, version
