"""Tracing without a server: the sampling decision, spans from a request's clock readings, and the SDK
sink exporting to a real OTLP receiver on loopback (aieng/tools/otlp_sink.py) or counting its drops."""
from __future__ import annotations

import random
import socket
import time

import pytest

from aieng.frontend.observe import spans
from aieng.frontend.observe.otel import remote_parent
from aieng.frontend.observe.tracing import (
    Tracing,
    begin_ctx,
    decision_from_env,
    enabled_by,
    sampler_from_env,
)
from aieng.frontend.requests.table import Request
from aieng.tools.otlp_sink import Collector
from aieng.wire import traceparent as tp
from aieng.wire.records import Step, Trail
from tests.waits import until

TID, SID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def trace_ids(n: int, seed: int) -> list[str]:
    """``n`` random W3C trace ids, the same in every run (a count of sampled ones is then exact)."""
    rng = random.Random(seed)
    return [f"{rng.getrandbits(128):032x}" for _ in range(n)]


def decide(env: dict, parent: tp.TraceParent | None, trace_id: str = TID) -> bool:
    """The server's decision (``decision_from_env``), checked against the SDK's own sampler's."""
    fast = begin_ctx(parent, trace_id, "", decision_from_env(env)).sampled
    ctx = remote_parent(parent, "") if parent is not None else None
    sdk = sampler_from_env(env).should_sample(ctx, int(trace_id, 16), "aieng infer").decision.is_sampled()
    assert fast == sdk, (env, parent, trace_id)
    return fast


def test_bad_settings_turn_tracing_off_never_fail(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "many")
    assert not Tracing.from_env(lambda n: None, lambda r, n: None).enabled
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "10")  # below the export batch size (512): the SDK refuses
    assert not Tracing.from_env(lambda n: None, lambda r, n: None).enabled
    monkeypatch.delenv("OTEL_BSP_MAX_QUEUE_SIZE")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "5")  # not a probability
    assert not Tracing.from_env(lambda n: None, lambda r, n: None).enabled
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    good = Tracing.from_env(lambda n: None, lambda r, n: None)
    assert good.enabled
    good.close(0.5)


def test_enabled_only_with_an_endpoint_and_not_disabled():
    assert not enabled_by({})
    assert enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert enabled_by({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    assert not enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"})
    assert not enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"})
    assert enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": ""})
    assert not enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})
    off = Tracing()
    assert not off.enabled and off.decide is None


def test_default_sampler_is_parent_based_one_percent():
    sampled, unsampled = tp.TraceParent(TID, SID, 1), tp.TraceParent(TID, SID, 0)
    assert decide({}, sampled) is True and decide({}, unsampled) is False  # the caller's flag wins
    hits = sum(decide({}, None, i) for i in trace_ids(4000, 0))
    assert 10 <= hits <= 90, hits  # 1% of 4000 = 40 (the ids are fixed: this count never changes)
    assert decide({}, None, "0" * 31 + "1") is True  # the ratio keeps the low trace ids (deterministic)


def test_configured_samplers():
    unsampled = tp.TraceParent(TID, SID, 0)
    assert decide({"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, None) is True
    assert decide({"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, unsampled) is False
    assert decide({"OTEL_TRACES_SAMPLER": "always_on"}, unsampled) is True  # not parent-based
    assert decide({"OTEL_TRACES_SAMPLER": "always_off"}, tp.TraceParent(TID, SID, 1)) is False
    env = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    assert 120 <= sum(decide(env, None, i) for i in trace_ids(400, 1)) <= 280
    assert decide({"OTEL_TRACES_SAMPLER": "no_such_sampler"}, tp.TraceParent(TID, SID, 1)) is True


def test_begin_joins_or_starts_and_disabled_never_samples():
    parent = tp.TraceParent(TID, SID, 1)
    ctx = begin_ctx(parent, TID, "k=v", None)
    assert (ctx.trace_id, ctx.parent, ctx.state, ctx.sampled) == (TID, parent, "k=v", False)
    assert ctx.span_id != SID and len(ctx.span_id) == 16
    assert ctx.header() == f"00-{TID}-{ctx.span_id}-00"
    # a client's non-W3C trace_id: a fresh OTel id
    own = begin_ctx(None, "my-trace", "", lambda trace_id, parent: True)
    assert tp.valid_trace_id(own.trace_id) and own.parent is None and own.sampled
    assert own.header().endswith("-01")
    w3c = begin_ctx(None, TID, "", None)  # a client's W3C trace_id is the trace
    assert w3c.trace_id == TID


def trail(t0: float) -> Trail:
    return Trail(pre_started=t0 + 0.002, pre_sent=t0 + 0.004, exec_arrived=t0 + 0.005,
                 batch_started=t0 + 0.007, infer_us=3000, seq_len=9, batch=4, padded=12,
                 post_started=t0 + 0.011, post_us=2000)


def test_answered_stages_ordered_within_the_request():
    t0 = 100.0
    steps = [Step("softmax", 500, "ok"), Step("topk", 700, "ok")]
    got = spans.answered(t0, t0 + 0.001, trail(t0), steps, t0 + 0.014, t0 + 0.015)
    assert [s.name for s in got] == list(spans.CHAIN) + ["postprocess.softmax", "postprocess.topk"]
    chain = got[:len(spans.CHAIN)]
    assert chain[0].start == t0 and chain[-1].end == t0 + 0.015
    for a, b in zip(chain, chain[1:]):
        assert a.end == b.start and a.start <= a.end
    assert all(s.parent == spans.SERVER for s in chain)
    by = {s.name: s for s in got}
    assert by["inference"].attrs == {"aieng.batch_size": 4, "aieng.padded_len": 12, "aieng.seq_len": 9}
    assert by["inference"].end - by["inference"].start == pytest.approx(0.003)
    post = spans.CHAIN.index("postprocess")
    soft, top = by["postprocess.softmax"], by["postprocess.topk"]
    assert soft.parent == top.parent == post
    assert soft.start == by["postprocess"].start and soft.end == top.start
    assert top.end <= by["postprocess"].end


def test_answered_clamps_out_of_order_readings():
    t0 = 50.0
    t = trail(t0)
    t.exec_arrived = t0 + 0.0045  # fine; then a reading before its predecessor and one past the end
    t.batch_started = t0 + 0.003
    t.post_started = t0 + 0.5
    got = spans.answered(t0, t0 + 0.001, t, [Step("x", 10_000_000, "ok")], t0 + 0.014, t0 + 0.015)
    for s in got:
        assert t0 <= s.start <= s.end <= t0 + 0.015, s
    chain = got[:len(spans.CHAIN)]
    assert all(a.end == b.start for a, b in zip(chain, chain[1:]))


def test_failed_and_page_stages():
    got = spans.failed(1.0, 0.0, "preprocess", 2.0)
    assert [(s.name, s.start, s.end) for s in got] == [("frontend_in", 1.0, 2.0)]
    got = spans.failed(1.0, 1.25, "executor", 2.0)
    assert [(s.name, s.start, s.end) for s in got] == [("frontend_in", 1.0, 1.25), ("executor", 1.25, 2.0)]
    timing = {"textdet": 100_000, "crop": 5_000, "textrec": 200_000, "join": 1_000, "total": 301_000}
    got = spans.page(10.0, timing, {"crops": 7, "crop_batch_mean": 3.5}, 10.302)
    assert [s.name for s in got] == ["textdet", "textrec", "join"]
    assert got[0].start == 10.0 and got[0].end == got[1].start and got[1].end == got[2].start
    assert got[2].end <= 10.302
    assert got[1].attrs == {"aieng.crops": 7, "aieng.crop_us": 5000, "aieng.crop_batch_mean": 3.5}


class Counts:
    def __init__(self):
        self.exported = 0
        self.dropped: dict[str, int] = {}

    def sent(self, n):
        self.exported += n

    def lost(self, reason, n):
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def request(ctx) -> Request:
    now = time.monotonic()
    r = Request(1, [b"c"], 7, "tabular", "1", now + 1, now - 0.02, {}, trace=ctx.trace_id, route="weight",
                tctx=ctx)
    r.dispatched = now - 0.019
    return r


def tracing(monkeypatch, endpoint: str, counts: Counts, **env) -> Tracing:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "aieng-unit",
           "OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_BSP_SCHEDULE_DELAY": "50", **env}
    for k in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Tracing.from_env(counts.sent, counts.lost)


def test_sink_exports_server_span_and_children_to_a_collector(monkeypatch):
    col, counts = Collector(), Counts()
    tr = tracing(monkeypatch, col.endpoint, counts)
    try:
        parent = tp.TraceParent(TID, SID, 1)
        ctx = tr.begin(parent, TID, "k=v")
        assert ctx.sampled
        req = request(ctx)
        t0 = req.received
        tr.request(req, trail(t0), [Step("softmax", 500, "ok")], t0 + 0.016, t0 + 0.017)
        assert until(lambda: len(col.spans_of(TID)) >= 12, 10), col.spans
        got = col.spans_of(TID)
        assert len(got) == 12, got
        root = [s for s in got if s.kind == 2]
        assert len(root) == 1 and root[0].span_id == ctx.span_id and root[0].parent_id == SID
        assert root[0].name == "aieng infer tabular" and root[0].resource["service.name"] == "aieng-unit"
        assert root[0].attrs["aieng.model"] == "tabular" and root[0].attrs["aieng.outcome"] == "OK"
        kids = {s.name: s for s in got if s.kind != 2}
        assert set(kids) == set(spans.CHAIN) | {"postprocess.softmax"}
        assert all(kids[n].parent_id == ctx.span_id for n in spans.CHAIN)
        assert kids["postprocess.softmax"].parent_id == kids["postprocess"].span_id
        assert all(root[0].start_ns <= s.start_ns <= s.end_ns <= root[0].end_ns for s in got)
        assert abs(root[0].start_ns / 1e9 - time.time()) < 60  # epoch time, not monotonic
        assert until(lambda: counts.exported == 12, 5) and counts.dropped == {}
    finally:
        tr.close()
        col.close()


def test_sink_failed_request_is_an_error_span(monkeypatch):
    col, counts = Collector(), Counts()
    tr = tracing(monkeypatch, col.endpoint, counts)
    try:
        ctx = tr.begin(None, tp.new_trace_id(), "")
        req = request(ctx)
        req.stage = "executor"
        tr.failed(req, "TIMEOUT", "no answer within the deadline", time.monotonic())
        assert until(lambda: len(col.spans_of(ctx.trace_id)) >= 3, 10), col.spans
        got = col.spans_of(ctx.trace_id)
        assert len(got) == 3, got
        root = [s for s in got if s.kind == 2][0]
        assert root.parent_id == "" and root.status == 2 and root.attrs["error.type"] == "TIMEOUT"
        assert sorted(s.name for s in got if s.kind != 2) == ["executor", "frontend_in"]
    finally:
        tr.close()
        col.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sink_counts_drops_when_the_collector_is_gone_and_closes_promptly(monkeypatch):
    counts = Counts()
    tr = tracing(monkeypatch, f"http://127.0.0.1:{closed_port()}", counts, OTEL_BSP_MAX_QUEUE_SIZE="40",
                 OTEL_BSP_MAX_EXPORT_BATCH_SIZE="20",
                 OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="1")
    ctx = tr.begin(tp.TraceParent(TID, SID, 1), TID, "")
    t0 = time.monotonic()
    for _ in range(10):  # 11 spans each: the fourth request no longer fits a queue of 40
        req = request(ctx)
        tr.request(req, trail(req.received), [], req.received + 0.016, req.received + 0.017)
    assert time.monotonic() - t0 < 5  # never waited on the collector (a generous bound: no speed test)
    assert counts.dropped.get("queue_full", 0) >= 11 * 6
    assert until(lambda: counts.dropped.get("export_failed", 0) >= 11, 10), counts.dropped
    started = time.monotonic()
    tr.close(timeout_s=1.0)
    assert time.monotonic() - started < 3.0
    assert counts.exported == 0
