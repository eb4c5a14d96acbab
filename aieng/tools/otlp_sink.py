"""A loopback OTLP/HTTP trace receiver for ``aieng bench --tracing`` and the tests: ``POST /v1/traces``
with an ``ExportTraceServiceRequest`` (http/protobuf) body, decoded with the published protos.

``Collector()`` starts it on a free loopback port (``endpoint``); it answers 200 with an empty
``ExportTraceServiceResponse``, counts every span (``count``) and keeps the first ``keep`` as ``Got``
records with their resource's attributes; ``spans_of(trace_id)`` reads them; ``close()`` stops it (the
port is closed after).  Not a collector to run in production: one process, no retries, no forwarding.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


class Got(NamedTuple):
    trace_id: str  # 32 hex
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: int  # Span.SpanKind: 2 SERVER, 1 INTERNAL
    start_ns: int
    end_ns: int
    attrs: dict
    status: int  # Status.StatusCode: 0 unset, 1 ok, 2 error
    resource: dict
    trace_state: str


class Collector:
    def __init__(self, keep: int = 1_000_000) -> None:
        self.keep, self.count, self.posts = keep, 0, 0
        self.spans: list[Got] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                owner.receive(ExportTraceServiceRequest.FromString(body))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-sink", daemon=True)
        self.thread.start()

    def receive(self, req: ExportTraceServiceRequest) -> None:
        got = []
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Got(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name, s.kind,
                                   s.start_time_unix_nano, s.end_time_unix_nano,
                                   {a.key: _value(a.value) for a in s.attributes}, s.status.code, resource,
                                   s.trace_state))
        with self.lock:
            self.posts += 1
            self.count += len(got)
            self.spans.extend(got[:max(0, self.keep - len(self.spans))])

    def spans_of(self, trace_id: str) -> list[Got]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
