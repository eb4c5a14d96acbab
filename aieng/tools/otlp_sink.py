"""A loopback OTLP/HTTP trace receiver: ``POST /v1/traces`` with an ``ExportTraceServiceRequest``
(http/protobuf), decoded with the OpenTelemetry protos, for ``aieng bench --tracing`` and the tests.

It answers 200 with an empty ``ExportTraceServiceResponse`` and keeps the decoded spans, at most ``keep``
of them (the count goes on past that), each with its resource's attributes.  Not a collector to run in
production: one process, no retries, no forwarding.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


@dataclass
class ReceivedSpan:
    """One span as received: ids in lowercase hex (parent ``""`` for a root)."""
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    status: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpSink:
    def __init__(self, keep: int = 100_000):
        self.keep, self.spans, self.count, self.posts = keep, [], 0, 0
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                sink.received(body)
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="otlp-sink", daemon=True)

    def start(self) -> "OtlpSink":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def received(self, body: bytes) -> None:
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(body)
        got = []
        for rs in req.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        str(res.get("service.name", "")), s.name, s.trace_id.hex(), s.span_id.hex(),
                        s.parent_span_id.hex(), int(s.kind), int(s.start_time_unix_nano),
                        int(s.end_time_unix_nano), int(s.status.code),
                        {a.key: _value(a.value) for a in s.attributes}))
        with self.lock:
            self.posts += 1
            self.count += len(got)
            self.spans.extend(got[:max(0, self.keep - len(self.spans))])

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans received so far of one trace (32 lowercase hex)."""
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]
