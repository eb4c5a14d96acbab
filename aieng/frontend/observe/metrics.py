"""Prometheus metrics for the whole server, kept in the frontend.

Every request's outcome and stage timings pass through the frontend, so it
can count them all in one registry: nothing counted in a worker is lost, and
nothing needs aggregating across processes.  Process-level facts (resident
memory of every process, restarts, model state, GPU memory) come from a
snapshot the frontend refreshes in its loop and a collector reads at scrape
time.  Names follow Prometheus conventions (``aieng_`` prefix, ``_total``,
``_seconds``, ``_bytes``); docs/metrics.md lists them.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from aieng.frontend.observe.compact import Counters, Gauges, Histograms
from aieng.frontend.observe.stats import STAGES

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STAGE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                 1.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
COLD_LOAD_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _SnapshotCollector:
    def __init__(self, metrics: "Metrics"):
        self.metrics = metrics

    def collect(self):
        snap = self.metrics.published()
        restarts = CounterMetricFamily("aieng_worker_restarts", "Process restarts by role", labels=["role"])
        for role, n in sorted(snap.get("restarts", {}).items()):
            restarts.add_metric([role], n)
        yield restarts
        rss = GaugeMetricFamily("aieng_process_resident_memory_bytes",
                                "Resident memory of each aieng process", labels=["role", "worker"])
        for (role, worker), value in sorted(snap.get("rss", {}).items()):
            rss.add_metric([role, worker], value)
        yield rss
        loaded = GaugeMetricFamily("aieng_model_loaded", "1 when the model version is loaded and warmed",
                                   labels=["model", "version", "provider"])
        for (model, version, provider), value in sorted(snap.get("models", {}).items()):
            loaded.add_metric([model, version, provider], value)
        yield loaded
        ready = GaugeMetricFamily("aieng_ready", "1 when the server accepts inference requests")
        ready.add_metric([], 1.0 if snap.get("ready") else 0.0)
        yield ready
        gpu_used = GaugeMetricFamily("aieng_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"])
        gpu_util = GaugeMetricFamily("aieng_gpu_utilization_ratio", "GPU utilisation (0-1)", labels=["gpu"])
        for idx, (used, util) in sorted(snap.get("gpus", {}).items()):
            gpu_used.add_metric([str(idx)], used)
            gpu_util.add_metric([str(idx)], util)
        yield gpu_used
        yield gpu_util
        drift = GaugeMetricFamily("aieng_input_drift_psi",
                                  "Population stability index of recent inputs against the model's reference",
                                  labels=["model", "version", "feature"])
        for (model, version, feature), value in sorted(snap.get("drift", {}).items()):
            drift.add_metric([model, version, feature], value)
        yield drift
        out_drift = GaugeMetricFamily(
            "aieng_output_drift_psi", "Population stability index of recent outputs (confidence: top class "
            "probability; distance: cosine distance of the embedding to the golden centroid) against the "
            "version's reference", labels=["model", "version", "output"])
        for (model, version, output), value in sorted(snap.get("output_drift", {}).items()):
            out_drift.add_metric([model, version, output], value)
        yield out_drift
        ref_ready = GaugeMetricFamily(
            "aieng_drift_reference_ready", "1 when the version's drift reference is complete, 0 while it is "
            "collected from its first answers", labels=["model", "version", "source"])
        ref_seen = GaugeMetricFamily(
            "aieng_drift_reference_collected", "Answers collected into the version's drift reference so far "
            "(of AIENG_DRIFT_REFERENCE_N)", labels=["model", "version"])
        for (model, version), ref in sorted(snap.get("drift_refs", {}).items()):
            ref_ready.add_metric([model, version, ref["input"]], 1.0 if ref["state"] == "ready" else 0.0)
            ref_seen.add_metric([model, version], ref["collected"])
        yield ref_ready
        yield ref_seen
        clients = snap.get("clients", {})
        dropped = CounterMetricFamily("aieng_client_replies_dropped",
                                      "Replies dropped: the client's send queue was full (it does not read) "
                                      "or it was gone", labels=["reason"])
        for reason, n in sorted(clients.get("replies_dropped", {}).items()):
            dropped.add_metric([reason], n)
        yield dropped
        refused = CounterMetricFamily("aieng_client_messages_refused",
                                      "Client messages answered OVERLOADED by a rate limit", labels=["limit"])
        for limit, n in sorted(clients.get("refused", {}).items()):
            refused.add_metric([limit], n)
        yield refused


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counters("aieng_requests", "Inference requests answered, by result code",
                                 ["model", "version", "code"], registry=r)
        self.latency = Histograms("aieng_request_duration_seconds", "End-to-end latency of answered requests",
                                  ["model", "version"], buckets=LATENCY_BUCKETS, registry=r)
        self.stage = Histograms("aieng_stage_duration_seconds", "Time per pipeline stage (see aieng report)",
                                ["model", "version", "stage"], buckets=STAGE_BUCKETS, registry=r)
        self.batch = Histograms("aieng_batch_size", "Rows in the batch each request ran in",
                                ["model", "version"], buckets=BATCH_BUCKETS, registry=r)
        self.routes = Counters("aieng_route_decisions", "Inference requests routed, by version and why "
                               "(pinned, rule:<name>, weight)", ["model", "version", "route"], registry=r)
        self.rollbacks = Counter("aieng_rollout_auto_rollbacks", "Canary versions set to weight 0 by "
                                 "automatic rollback", ["model", "version"], registry=r)
        self.state_writes = Counter("aieng_routing_state_writes", "Writes of the routing state file, by "
                                    "outcome (ok, failed: retried until one succeeds)", ["outcome"],
                                    registry=r)
        for outcome in ("ok", "failed"):  # present at 0 from the start
            self.state_writes.labels(outcome)
        # Where each model's routing came from (docs/rollout.md, section 11): one series per model, its
        # ``digest`` label that of the model.yaml routing it follows (the same on every replica that read it)
        self.generation = Gauges("aieng_routing_generation", "Generations of model.yaml routing this replica "
                                 "applied since start; digest: the routing section's sha256 prefix",
                                 ["model", "digest"], registry=r)
        self.routing_local = Gauges("aieng_routing_local_change", "1 while a change made on this replica "
                                    "(admin, auto-rollback) is in force over model.yaml's routing", ["model"],
                                    registry=r)
        self.routing_refused = Gauges("aieng_routing_model_yaml_refused", "1 while the model's model.yaml "
                                      "is refused (malformed, missing): the routing in force stays",
                                      ["model"], registry=r)
        self.version_loads = Counter("aieng_version_loads", "Run-time loads of model versions, by outcome "
                                     "(ok: routable after its golden set; failed)",
                                     ["model", "version", "outcome"], registry=r)
        self.cold_loads = Histograms("aieng_model_cold_load_seconds", "Loads of a lazy model's version "
                                     "started by a request (build, warm-up and golden set), until routable",
                                     ["model", "version"], buckets=COLD_LOAD_BUCKETS, registry=r)
        self.evictions = Counter("aieng_model_evictions", "Versions of lazy models evicted (least recently "
                                 "used) to load another within AIENG_MODEL_MEMORY_BUDGET",
                                 ["model", "version"], registry=r)
        self.confidence = Histograms("aieng_output_confidence", "Top class probability of classifier answers",
                                     ["model", "version"], buckets=tuple(i / 10 for i in range(1, 11)),
                                     registry=r)
        self.worker = Counter("aieng_worker_requests",
                              "Requests each worker finished its stage of (result or error)",
                              ["role", "worker"], registry=r)
        self.cache_hits = Counter("aieng_cache_hits", "Requests answered from the response cache", ["model"],
                                  registry=r)
        self.in_flight = Gauge("aieng_in_flight_requests", "Requests admitted and not yet answered",
                               registry=r)
        self.queue = Gauge("aieng_queue_depth", "Requests in flight per pipeline stage", ["stage"],
                           registry=r)
        self.http_dropped = Counter("aieng_http_dropped_connections",
                                    "HTTP connections closed without an answer (timeout, reset, overflow)",
                                    ["reason"], registry=r)
        for reason in ("timeout", "reset", "overflow"):  # present at 0 from the start
            self.http_dropped.labels(reason)
        self.spans_exported = Counter("aieng_trace_spans_exported", "Spans the OTLP exporter delivered",
                                      registry=r)
        self.spans_dropped = Counter("aieng_trace_spans_dropped", "Spans never delivered: the export queue "
                                     "was full or the collector failed the batch", ["reason"], registry=r)
        for reason in ("queue_full", "export_failed"):
            self.spans_dropped.labels(reason)
        self._published: dict[str, Any] = {}  # swapped whole by ``publish``; read by the collector
        self._kids: dict[tuple[str, str], tuple] = {}
        self._routes: dict[tuple[str, str, str], Any] = {}
        r.register(_SnapshotCollector(self))

    def _children(self, model: str, version: str) -> tuple:
        """The labelled series one model version's answers touch, looked up once (the profile showed
        ``labels()`` at 7% of the frontend's busy time when done per request)."""
        key = (model, version)
        kids = self._kids.get(key)
        if kids is None:
            kids = self._kids[key] = (
                self.requests.labels(model, version, "OK"),
                self.latency.labels(model, version),
                tuple(self.stage.labels(model, version, s) for s in STAGES),  # in STAGES' order
                self.batch.labels(model, version),
                self.confidence.labels(model, version),
            )
        return kids

    def answered(self, model: str, version: str, timing_us: dict[str, int], batch: int,
                 confidence: float | None) -> None:
        ok, latency, stages, batches, conf = self._children(model, version)
        ok.inc()
        latency.observe(timing_us.get("total", 0) / 1e6)
        for stage, hist in zip(STAGES, stages):  # a tuple of series, not of pairs: ~0.5 KiB less a version
            if stage in timing_us:
                hist.observe(timing_us[stage] / 1e6)
        batches.observe(batch)
        if confidence is not None:
            conf.observe(confidence)

    def routed(self, model: str, version: str, route: str) -> None:
        key = (model, version, route)  # bounded: versions served x (pinned, weight, configured rules)
        child = self._routes.get(key)
        if child is None:
            child = self._routes[key] = self.routes.labels(model, version, route)
        child.inc()

    def auto_rollback(self, model: str, version: str) -> None:
        self.rollbacks.labels(model, version).inc()

    def state_write(self, outcome: str) -> None:
        """Called from the state writer's thread (prometheus_client counters are thread-safe)."""
        self.state_writes.labels(outcome).inc()

    def routing_source(self, model: str, digest: str, number: int, local: bool, refused: bool,
                       before: tuple | None = None) -> None:
        """``before``: what was exported for the model last (its old digest's series is removed)."""
        if before is not None and before[0] != digest:
            self.generation.remove(model, before[0])
        self.generation.labels(model, digest).set(number)
        self.routing_local.labels(model).set(1 if local else 0)
        self.routing_refused.labels(model).set(1 if refused else 0)

    def version_load(self, model: str, version: str, outcome: str) -> None:
        self.version_loads.labels(model, version, outcome).inc()

    def cold_load(self, model: str, version: str, seconds: float) -> None:
        self.cold_loads.labels(model, version).observe(seconds)

    def eviction(self, model: str, version: str) -> None:
        self.evictions.labels(model, version).inc()

    def failed(self, model: str, version: str, code: str) -> None:
        self.requests.labels(model, version, code).inc()

    def dropped_connection(self, reason: str) -> None:
        """Called from HTTP threads (prometheus_client counters are thread-safe)."""
        self.http_dropped.labels(reason).inc()

    def spans_sent(self, n: int) -> None:
        """Called from the OTel SDK's export thread, as ``spans_lost``."""
        self.spans_exported.inc(n)

    def spans_lost(self, reason: str, n: int) -> None:
        self.spans_dropped.labels(reason).inc(n)

    def publish(self, snap: dict[str, Any]) -> None:
        """What the collector serves from now on (restarts, memory, models, ready, drift, clients)."""
        self._published = snap

    def published(self) -> dict[str, Any]:
        return self._published

    def render(self) -> bytes:
        return generate_latest(self.registry)
