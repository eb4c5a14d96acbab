"""The OpenTelemetry SDK side of ``tracing``: provider, batch processor, OTLP http/protobuf exporter.

``Sink`` builds a ``TracerProvider`` (resource ``service.name``; the sampler is ALWAYS_ON: ``tracing``
decided at admission, and only sampled requests get here) with a ``BatchSpanProcessor`` (the SDK reads
``OTEL_BSP_*``) over ``OTLPSpanExporter`` (the SDK reads ``OTEL_EXPORTER_OTLP_*``).  ``emit`` makes the
server span (kind SERVER, parented on the caller's span, with the ids the answer already carried:
``_Ids`` hands them to the SDK) and its children with explicit times (one monotonic-to-epoch offset).
Bounded: ``pending`` counts spans handed to the processor and not yet exported or failed (``_Counted``
sees every batch end); a request whose spans would take it past ``limit`` gets none (counted dropped),
so the processor's own queue never overflows and drops silently.  ``close`` shuts the processor down
on a daemon thread and waits at most its timeout; past it, the exporter is told to stop retrying.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from opentelemetry import trace as api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from aieng.frontend.observe.spans import SERVER


def remote_parent(parent, state: str):
    """An OTel context holding the caller's span (``parent``: a ``traceparent.TraceParent``)."""
    ts = TraceState.from_header([state]) if state else None
    sc = SpanContext(int(parent.trace_id, 16), int(parent.span_id, 16), is_remote=True,
                     trace_flags=TraceFlags(parent.flags & 1), trace_state=ts)
    return api.set_span_in_context(api.NonRecordingSpan(sc))


class _Seldom(logging.Filter):
    """One record a minute: a collector that is gone would log each retry of each batch."""

    def __init__(self) -> None:
        super().__init__()
        self.last = -1e9

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self.last < 60.0:
            return False
        self.last = now
        return True


class _Ids(IdGenerator):
    """Random ids, but the server span's are the ones the answer carried (set just before it starts)."""

    def __init__(self) -> None:
        self.rand = RandomIdGenerator()
        self.trace_id = self.span_id = 0

    def generate_trace_id(self) -> int:
        tid, self.trace_id = self.trace_id, 0
        return tid or self.rand.generate_trace_id()

    def generate_span_id(self) -> int:
        sid, self.span_id = self.span_id, 0
        return sid or self.rand.generate_span_id()


class _Counted(SpanExporter):
    """The exporter, counting each batch's spans as exported or failed (on the SDK's thread)."""

    def __init__(self, inner: SpanExporter, settled: Callable[[int, bool], None]):
        self.inner, self.settled = inner, settled
        self.stopped = False
        self.lock = threading.Lock()

    def export(self, batch) -> SpanExportResult:
        try:
            result = self.inner.export(batch)
        except Exception:
            result = SpanExportResult.FAILURE
        self.settled(len(batch), result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        with self.lock:  # once: from ``close`` (stop retrying) or from the processor's own shutdown
            if self.stopped:
                return
            self.stopped = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class Sink:
    def __init__(self, service: str, limit: int, exported: Callable[[int], None],
                 dropped: Callable[[str, int], None]):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        self.limit, self.exported, self.dropped = limit, exported, dropped
        self.pending = 0
        self.lock = threading.Lock()
        self.offset = time.time_ns() - time.monotonic_ns()
        self.ids = _Ids()
        logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter").addFilter(_Seldom())
        self.exporter = _Counted(OTLPSpanExporter(), self.settled)
        self.processor = BatchSpanProcessor(self.exporter, max_queue_size=limit)
        self.provider = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create({"service.name": service}),
                                       id_generator=self.ids, shutdown_on_exit=False)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("aieng")

    def settled(self, n: int, ok: bool) -> None:
        with self.lock:
            self.pending -= n
        if ok:
            self.exported(n)
        else:
            self.dropped("export_failed", n)

    def ns(self, mono_s: float) -> int:
        return int(mono_s * 1e9) + self.offset

    def emit(self, ctx, name: str, attrs: dict, start: float, end: float, stages: list, error: str) -> None:
        n = len(stages) + 1
        with self.lock:
            room = self.pending + n <= self.limit
            if room:
                self.pending += n
        if not room:
            return self.dropped("queue_full", n)
        parent = remote_parent(ctx.parent, ctx.state) if ctx.parent is not None else None
        self.ids.trace_id, self.ids.span_id = int(ctx.trace_id, 16), int(ctx.span_id, 16)
        root = self.tracer.start_span(name, parent, SpanKind.SERVER, attrs, start_time=self.ns(start))
        self.ids.trace_id = self.ids.span_id = 0
        if error or attrs.get("aieng.outcome", "OK") != "OK":
            root.set_status(Status(StatusCode.ERROR, error or attrs.get("aieng.outcome")))
        made = []
        for st in stages:
            up = root if st.parent == SERVER else made[st.parent]
            span = self.tracer.start_span(st.name, api.set_span_in_context(up), SpanKind.INTERNAL, st.attrs,
                                          start_time=self.ns(st.start))
            made.append(span)
        for st, span in zip(stages, made):  # ended after all started: a parent's children can find it
            span.end(end_time=self.ns(st.end))
        root.end(end_time=self.ns(end))

    def close(self, timeout_s: float) -> None:
        t = threading.Thread(target=self.processor.shutdown, name="aieng-otel-close", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():  # the collector is slow or gone: stop the exporter's retries, leave the rest
            self.exporter.shutdown()
