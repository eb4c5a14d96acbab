"""W3C trace context and OpenTelemetry spans per stage through the real server (issue 23).

A real OTLP/HTTP receiver runs on loopback in the test (``aieng/tools/otlp_sink.py``: the published
protos decode each ``ExportTraceServiceRequest``); the server exports to it by the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``; the default parent-based sampler, so the
caller's sampled flag decides).

* A request with a ``traceparent`` over OIP HTTP (header), gRPC (metadata) and native (field) is
  answered with the same trace id and the server's own span id; the collector gets that trace: the
  server span parented on the caller's span, ``service.name`` aieng-test, one child per stage
  (tabular, minilm: exactly the stages of ``timing_us``; ocr: its pipeline steps).
* A caller that did not sample gets no spans; a malformed ``traceparent`` is answered with a fresh valid
  trace; a failed request gets an ERROR server span.
* A collector that is gone: every request is answered, ``aieng_trace_spans_dropped_total`` rises,
  the server stops promptly and cleanly.
"""
from __future__ import annotations

import json
import socket
import urllib.request

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb  # tritonclient's own stubs: the published protos
from tritonclient.grpc import service_pb2_grpc as pbg

from aieng.frontend.observe.spans import CHAIN, PAGE_STEPS
from aieng.tools.otlp_sink import Collector
from aieng.wire import traceparent as tp
from tests.conftest import ServerProcess
from tests.e2e.scrape import samples, total
from tests.waits import until

pytestmark = pytest.mark.e2e
SERVER, INTERNAL, ERROR = 2, 1, 2  # OTLP's Span.SpanKind and Status.StatusCode values
TABULAR = {"island": "Dream", "bill_length_mm": 45.0, "bill_depth_mm": 17.0, "flipper_length_mm": 200.0,
           "body_mass_g": 4000.0, "sex": "male"}


@pytest.fixture(scope="module")
def collector():
    col = Collector()
    yield col
    col.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, collector):
    srv = ServerProcess(tmp_path_factory.mktemp("tracing"), AIENG_MODELS="tabular,minilm,textdet,textrec,ocr",
                        AIENG_PREPROCESS_WORKERS="1", AIENG_POSTPROCESS_WORKERS="1",
                        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint, OTEL_SERVICE_NAME="aieng-test",
                        # a caller's sampled flag decides; a trace that starts here is never sampled (the
                        # default 1% would sample one now and then: no assertion may depend on chance)
                        OTEL_TRACES_SAMPLER="parentbased_always_off",
                        OTEL_BSP_SCHEDULE_DELAY="100").start(timeout=180)
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def caller(sampled: bool = True) -> str:
    return tp.format_header(tp.new_trace_id(), tp.new_span_id(), sampled)


def check_answer(header: str, sent: str) -> tp.TraceParent:
    got, parent = tp.parse(header), tp.parse(sent)
    assert got is not None, header
    assert got.trace_id == parent.trace_id and got.span_id != parent.span_id
    assert got.sampled == parent.sampled
    return got


def trace_spans(collector: Collector, answer: tp.TraceParent, n: int) -> tuple:
    arrived = until(lambda: len(collector.spans_of(answer.trace_id)) >= n, 20)
    assert arrived, collector.spans_of(answer.trace_id)
    got = collector.spans_of(answer.trace_id)
    roots = [s for s in got if s.kind == SERVER]
    assert len(roots) == 1, got
    return roots[0], [s for s in got if s.kind != SERVER]


def check_server_span(root, answer: tp.TraceParent, sent: str, model: str) -> None:
    assert root.span_id == answer.span_id and root.parent_id == tp.parse(sent).span_id
    assert root.name == f"aieng infer {model}" and root.resource["service.name"] == "aieng-test"
    assert root.attrs["aieng.model"] == model and root.attrs["aieng.outcome"] == "OK"
    assert root.attrs["aieng.version"] == "1" and root.status != ERROR


def check_stages(root, kids, stage_names: set) -> None:
    by = {s.name: s for s in kids}
    assert set(by) == stage_names and len(kids) == len(stage_names), [s.name for s in kids]
    for s in kids:
        assert root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns, s
        up = by[s.name.split(".")[0]].span_id if s.name.startswith("postprocess.") else root.span_id
        assert s.parent_id == up, s


def oip_http(srv, model: str, body: dict, header: str | None) -> tuple[dict, str]:
    req = urllib.request.Request(f"http://{srv.oip_http}/v2/models/{model}/infer",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"traceparent": header} if header is not None else {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read()), r.headers.get("traceparent", "")


def test_trace_in_and_out_on_every_door_and_spans_per_stage(served, collector):
    # native: tabular; its stages are exactly its answer's timing_us stages
    sent = caller()
    with served.client(timeout_s=30) as c:
        r = c.infer("tabular", TABULAR, traceparent=sent)
    ans = check_answer(r["traceparent"], sent)
    assert r["trace_id"] == ans.trace_id
    root, kids = trace_spans(collector, ans, 1 + len(CHAIN))
    check_server_span(root, ans, sent, "tabular")
    steps = {k for k in r["timing_us"] if k.startswith("postprocess.")}
    check_stages(root, kids, set(CHAIN) | steps)
    run = next(s for s in kids if s.name == "inference")
    assert run.attrs["aieng.batch_size"] >= 1
    assert "aieng.padded_len" in run.attrs and "aieng.seq_len" in run.attrs

    # OIP HTTP: minilm, traceparent header in and out
    sent = caller()
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a trace of a text"]}]}
    out, header = oip_http(served, "minilm", body, sent)
    assert out["model_name"] == "minilm"
    ans = check_answer(header, sent)
    root, kids = trace_spans(collector, ans, 1 + len(CHAIN))
    check_server_span(root, ans, sent, "minilm")
    assert {s.name for s in kids} >= set(CHAIN)
    check_stages(root, kids, set(CHAIN) | {s.name for s in kids if s.name.startswith("postprocess.")})
    run = next(s for s in kids if s.name == "inference")
    assert run.attrs["aieng.seq_len"] > 0

    # gRPC: minilm, traceparent metadata in, trailing metadata out
    sent = caller()
    req = pb.ModelInferRequest(model_name="minilm")
    t = req.inputs.add(name="text", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(b"another traced text")
    with grpc.insecure_channel(served.oip_grpc) as ch:
        resp, call = pbg.GRPCInferenceServiceStub(ch).ModelInfer.with_call(
            req, metadata=(("traceparent", sent), ("tracestate", "k=v")), timeout=30)
    assert resp.model_name == "minilm"
    ans = check_answer(dict(call.trailing_metadata())["traceparent"], sent)
    root, kids = trace_spans(collector, ans, 1 + len(CHAIN))
    check_server_span(root, ans, sent, "minilm")
    assert root.trace_state == "k=v"  # the caller's tracestate, kept

    # ocr: the pipeline's steps, one page
    from tests.e2e.ocr_pages import make_page, png
    sent = caller()
    with served.client(timeout_s=120) as c:
        r = c.infer("ocr", {"image": png(make_page(4, 600, 400))}, traceparent=sent)
    ans = check_answer(r["traceparent"], sent)
    root, kids = trace_spans(collector, ans, 1 + len(PAGE_STEPS))
    check_server_span(root, ans, sent, "ocr")
    check_stages(root, kids, set(PAGE_STEPS))
    rec = next(s for s in kids if s.name == "textrec")
    assert rec.attrs["aieng.crops"] == r["crops"]


def test_unsampled_malformed_and_failed(served, collector):
    quiet = caller(sampled=False)
    with served.client(timeout_s=30) as c:
        r = c.infer("tabular", TABULAR, traceparent=quiet)
        q = check_answer(r["traceparent"], quiet)
        assert r["traceparent"].endswith("-00")
        bad = c.infer("tabular", TABULAR, traceparent="00-" + "A" * 32 + "-" + "b" * 16 + "-01")
        fresh = tp.parse(bad["traceparent"])
        assert fresh is not None and bad["trace_id"] == fresh.trace_id and "a" * 32 != fresh.trace_id
        assert not fresh.sampled  # its own trace, started here: never sampled (the fixture's sampler)
        sent = caller()
        failed = c.infer("minilm", {"text": 17}, traceparent=sent, raise_on_error=False)
    assert failed["ok"] is False and failed["error"]["code"] == "INVALID_INPUT"
    ans = check_answer(failed["traceparent"], sent)
    root, kids = trace_spans(collector, ans, 2)
    assert root.status == ERROR and root.attrs["error.type"] == failed["error"]["code"]
    assert root.parent_id == tp.parse(sent).span_id
    # the stages it reached: a lone small text is the executor's to encode (inline_pre), which refused it
    assert sorted(s.name for s in kids) == ["executor", "frontend_in"]
    assert all(s.kind == INTERNAL for s in kids)
    # the failed request's spans came after the unsampled one's would have: it had none
    assert collector.spans_of(q.trace_id) == []
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["no trace of it"]}]}
    out, header = oip_http(served, "minilm", body, "not-a-traceparent")
    assert out["model_name"] == "minilm" and tp.parse(header) is not None
    out, header = oip_http(served, "minilm", body, None)  # none at all: a trace of its own
    assert tp.parse(header) is not None and tp.parse(header).trace_id != fresh.trace_id


def dropped(srv) -> float:
    return total(samples(srv.http), "aieng_trace_spans_dropped_total")


def test_collector_gone_costs_counted_drops_only(make_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nobody listens there
    srv = make_server(AIENG_MODELS="tabular", OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                      OTEL_TRACES_SAMPLER="parentbased_always_on", OTEL_BSP_SCHEDULE_DELAY="100",
                      OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="1", OTEL_BSP_MAX_QUEUE_SIZE="64",
                      OTEL_BSP_MAX_EXPORT_BATCH_SIZE="32").start()
    with srv.client(timeout_s=30) as c:
        answers = [c.infer("tabular", TABULAR) for _ in range(40)]
    assert all(a["ok"] and tp.parse(a["traceparent"]).sampled for a in answers)
    assert until(lambda: dropped(srv) >= 40, 30), dropped(srv)
    assert srv.stop(timeout=20) == 0, srv.output()
