"""OpenTelemetry spans per request, exported over OTLP http/protobuf by the SDK, off the serving path.

``Tracing.from_env`` reads the standard variables only (docs/metrics.md, "Tracing"): with no
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
it builds no provider and no thread, and ``begin`` costs the id generation alone.  ``begin`` (at
admission) joins the caller's trace or starts one and takes the sampling decision once (the configured
sampler; default parent-based, 1% of the traces that come without a parent); the answer's
``traceparent`` carries the server span's id and that decision.  ``request``/``page``/``refused`` run
after the answer was sent, for sampled requests only: a server span and one child per stage, with
explicit times (``spans``), handed to the SDK's ``BatchSpanProcessor``.  Memory is bounded: spans
handed over and not yet exported or failed never pass ``OTEL_BSP_MAX_QUEUE_SIZE``; a request that would
pass it has none built (``aieng_trace_spans_dropped_total{reason="queue_full"}``), a batch the exporter
could not send is counted as ``reason="export_failed"``; nothing on the serving path waits on the
collector.  ``close`` flushes for at most ``CLOSE_S`` and never hangs the stop.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from aieng.frontend.observe import spans
from aieng.frontend.observe.spans import Stage
from aieng.wire import traceparent as tp

CLOSE_S = 1.5  # the flush at stop: the supervisor waits longer than this for the frontend
DEFAULT_RATIO = 0.01  # parent-based ratio when OTEL_TRACES_SAMPLER is unset
log = logging.getLogger("aieng.frontend.observe.tracing")


@dataclass(slots=True)
class TraceCtx:
    """One request's place in its trace: what the answer's ``traceparent`` says and its spans use."""
    trace_id: str  # 32 hex
    span_id: str  # 16 hex: the server span
    parent: tp.TraceParent | None  # the caller's span (None: the trace starts here)
    state: str  # the caller's tracestate, as it came
    sampled: bool

    def header(self) -> str:
        return tp.format_header(self.trace_id, self.span_id, self.sampled)


def begin_ctx(parent: tp.TraceParent | None, trace: str, state: str,
              decide: Callable[[str, tp.TraceParent | None], bool] | None) -> TraceCtx:
    """``trace`` is the request's trace id for logs: the OTel trace id too when it is a W3C one;
    ``decide``: the sampler's decision (``decision_from_env``; None: tracing off, never sampled)."""
    if parent is not None:
        trace_id = parent.trace_id
    else:
        trace_id = trace if tp.valid_trace_id(trace) else tp.new_trace_id()
    sampled = decide(trace_id, parent) if decide is not None else False
    return TraceCtx(trace_id, tp.new_span_id(), parent, state, sampled)


SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")


def sampler_choice(env: Mapping[str, str]) -> tuple[str, float]:
    """The sampler ``OTEL_TRACES_SAMPLER``/``_ARG`` name, and its ratio (our default:
    parentbased_traceidratio, 0.01; a named ratio sampler without an argument: 1.0, as the spec says)."""
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(arg) if arg else (DEFAULT_RATIO if not name else 1.0)
    except ValueError:
        log.warning("OTEL_TRACES_SAMPLER_ARG %r is not a number: ratio %s", arg, DEFAULT_RATIO)
        ratio = DEFAULT_RATIO
    if name and name not in SAMPLERS:
        log.warning("OTEL_TRACES_SAMPLER %r is not one aieng knows: parentbased_traceidratio", name)
        name = ""
    return name or "parentbased_traceidratio", ratio


def sampler_from_env(env: Mapping[str, str]):
    """The SDK's sampler the variables name (the reference ``decision_from_env`` answers as)."""
    from opentelemetry.sdk.trace import sampling as s
    name, ratio = sampler_choice(env)
    root = {"always_on": s.ALWAYS_ON, "always_off": s.ALWAYS_OFF,
            "traceidratio": s.TraceIdRatioBased(ratio)}[name.removeprefix("parentbased_")]
    return s.ParentBased(root) if name.startswith("parentbased_") else root


def decision_from_env(env: Mapping[str, str]) -> Callable[[str, tp.TraceParent | None], bool]:
    """``decide(trace_id, parent)``: the decision of ``sampler_from_env``'s sampler without building the
    SDK's context objects per request (a sixth of the frontend's tracing cost at 1,500 req/s): a
    parent-based sampler follows the caller's flag; a ratio keeps the trace ids whose low 64 bits are
    under the SDK's own bound (``TraceIdRatioBased.get_bound_for_rate``), so every service agrees."""
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
    sampler_from_env(env)  # the SDK's checks (a ratio outside 0..1 raises): one verdict on the settings
    name, ratio = sampler_choice(env)
    base, bound = name.removeprefix("parentbased_"), TraceIdRatioBased.get_bound_for_rate(ratio)

    def root(trace_id: str) -> bool:
        if base == "traceidratio":
            return int(trace_id[16:], 16) < bound
        return base == "always_on"

    if name.startswith("parentbased_"):
        return lambda trace_id, parent: parent.sampled if parent is not None else root(trace_id)
    return lambda trace_id, parent: root(trace_id)


def enabled_by(env: Mapping[str, str]) -> bool:
    """Whether the variables ask for spans: an OTLP endpoint named, the SDK and the exporter not off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if (env.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp") == "none":  # empty: the default
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


class Tracing:
    """Disabled (``Tracing()``) or exporting (``Tracing.from_env``); see the module's doc."""

    def __init__(self, sink: Any = None, decide: Callable[[str, tp.TraceParent | None], bool] | None = None
                 ) -> None:
        self.sink, self.decide = sink, decide  # both None: disabled

    @classmethod
    def from_env(cls, exported: Callable[[int], None], dropped: Callable[[str, int], None]) -> "Tracing":
        """From ``os.environ``, which the SDK reads too (one source); ``exported(n)`` and
        ``dropped(reason, n)`` count spans (called from the SDK's thread too)."""
        env = os.environ
        if not enabled_by(env):
            return cls()
        try:  # a bad OTEL_* value turns tracing off with a log line, never stops the server
            from aieng.frontend.observe.otel import Sink
            decide = decision_from_env(env)
            limit = int(env.get("OTEL_BSP_MAX_QUEUE_SIZE", "").strip() or 2048)
            sink = Sink(env.get("OTEL_SERVICE_NAME", "").strip() or "aieng", limit, exported, dropped)
        except Exception as exc:
            log.error("tracing is off: the OTEL_* variables do not make a sampler and exporter: %s", exc)
            return cls()
        return cls(sink, decide)

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def begin(self, parent: tp.TraceParent | None, trace: str, state: str) -> TraceCtx:
        return begin_ctx(parent, trace, state, self.decide)

    # -- after the answer ----------------------------------------------------------------------
    def request(self, req: Any, trail: Any, steps: Any, answered_at: float, sent: float) -> None:
        """``req`` (a table ``Request``) answered by the model."""
        ctx = req.tctx
        if ctx is None or not ctx.sampled or self.sink is None:
            return
        stages = spans.answered(req.received, req.dispatched, trail, steps, answered_at, sent)
        self.emit(req, ctx, stages, req.received, sent, "OK", "")

    def page(self, req: Any, timing: dict, extra: dict, sent: float) -> None:
        ctx = req.tctx
        if ctx is None or not ctx.sampled or self.sink is None:
            return
        self.emit(req, ctx, spans.page(req.received, timing, extra, sent), req.received, sent, "OK", "")

    def failed(self, req: Any, code: str, message: str, sent: float) -> None:
        ctx = req.tctx
        if ctx is None or not ctx.sampled or self.sink is None:
            return
        stages = spans.failed(req.received, req.dispatched, req.stage, sent)
        self.emit(req, ctx, stages, req.received, sent, code, message)

    def immediate(self, ctx: TraceCtx | None, model: str, version: str, route: str, received: float,
                  sent: float) -> None:
        """An answer admission found (cache hit, fallback): the server span alone."""
        if ctx is None or not ctx.sampled or self.sink is None:
            return
        attrs = {"aieng.model": model, "aieng.version": version, "aieng.route": route, "aieng.outcome": "OK",
                 "aieng.immediate": True}
        self.hand_over(ctx, model, attrs, [], received, sent, "")

    def emit(self, req: Any, ctx: TraceCtx, stages: list[Stage], start: float, end: float, code: str,
             message: str) -> None:
        attrs = {"aieng.model": req.model, "aieng.version": req.version, "aieng.route": req.route,
                 "aieng.outcome": code, "aieng.trace": req.trace}
        if code != "OK":
            attrs["error.type"] = code
        self.hand_over(ctx, req.model, attrs, stages, start, end, message)

    def hand_over(self, ctx: TraceCtx, model: str, attrs: dict, stages: list[Stage], start: float, end: float,
                  message: str) -> None:
        try:
            self.sink.emit(ctx, f"aieng infer {model}", attrs, start, end, stages, message)
        except Exception:  # spans are a view of the request: never a reason to fail the loop
            log.exception("building the spans of a request failed")

    def close(self, timeout_s: float = CLOSE_S) -> None:
        if self.sink is not None:
            self.sink.close(timeout_s)
