"""HTTP health and Prometheus metrics of a live server: /healthz, /readyz, /metrics, /debug."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.e2e.scrape import get, samples, value
from tests.waits import until

pytestmark = pytest.mark.e2e


def test_health_endpoints_and_metrics_add_up(server):
    code, body = get(server.http + "/healthz")
    assert code == 200 and json.loads(body)["live"]
    code, body = get(server.http + "/readyz")
    assert code == 200 and json.loads(body)["ready"]
    assert get(server.http + "/nope")[0] == 404

    before = samples(server.http)
    with server.client() as c:
        for i in range(7):
            c.infer("tabular", {"island": "Dream", "bill_length_mm": 40 + i})
        for _ in range(3):
            c.infer("tabular", {"island": 5}, raise_on_error=False)  # INVALID_INPUT
        c.infer("nope", {"x": 1}, raise_on_error=False)  # MODEL_NOT_FOUND
    # /metrics is rendered at most once per AIENG_SNAPSHOT_MS (500 ms): wait (bounded) for a render made
    # after these requests, i.e. the first one that differs from `before`
    after, deadline = samples(server.http), time.monotonic() + 5
    while after == before and time.monotonic() < deadline:
        time.sleep(0.1)
        after = samples(server.http)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("aieng_requests_total", model="tabular", version="1", code="OK") == 7
    assert delta("aieng_requests_total", model="tabular", version="1", code="INVALID_INPUT") == 3
    assert delta("aieng_requests_total", model="", version="", code="MODEL_NOT_FOUND") == 1
    assert delta("aieng_request_duration_seconds_count", model="tabular", version="1") == 7
    assert delta("aieng_stage_duration_seconds_count", model="tabular", version="1", stage="inference") == 7
    assert delta("aieng_stage_duration_seconds_count", model="tabular", version="1", stage="preprocess") == 7
    assert delta("aieng_batch_size_count", model="tabular", version="1") == 7
    assert delta("aieng_output_confidence_count", model="tabular", version="1") == 7
    # per-worker counts add up to what was sent: one request at a time on an idle server, the executor
    # preprocesses them itself (the idle route), a pool worker whatever came while the server was busy
    pre = {dict(k[1])["worker"]: delta(k[0], **dict(k[1])) for k in after
           if k[0] == "aieng_worker_requests_total" and dict(k[1])["role"] == "preprocess"}
    assert set(pre) <= {"pre-0", "pre-1", "executor"}, pre
    assert sum(pre.values()) == 10  # 7 answered + 3 refused by preprocessing; MODEL_NOT_FOUND never got there
    assert delta("aieng_worker_requests_total", role="executor", worker="executor") == 7
    # tabular's chain is microseconds: the executor postprocesses it itself (gpu_executor/inline_post)
    assert delta("aieng_worker_requests_total", role="postprocess", worker="executor") == 7
    names = {k[0] for k in after}
    assert {"aieng_in_flight_requests", "aieng_queue_depth", "aieng_ready", "aieng_model_loaded",
            "aieng_worker_restarts_total", "aieng_process_resident_memory_bytes"} <= names
    assert value(after, "aieng_ready") == 1.0
    roles = {dict(k[1]).get("role") for k in after if k[0] == "aieng_process_resident_memory_bytes"}
    assert roles >= {"frontend", "preprocess", "executor", "postprocess"}

    code, body = get(server.http + "/debug")  # the loop's snapshot, published every 0.5 s: wait for one
    deadline = time.monotonic() + 5           # that holds the tabular requests above
    while "tabular" not in json.loads(body)["stats"].get("models", {}) and time.monotonic() < deadline:
        time.sleep(0.1)
        code, body = get(server.http + "/debug")
    debug = json.loads(body)
    assert code == 200 and "queue_depth" in debug and debug["health"]["providers"]
    assert debug["stats"]["models"]["tabular"]["stages_us"]["inference"]["p50"] > 0
    assert set(debug["memory"]) >= {"frontend", "pre-0", "executor", "post-0"}


def test_readyz_turns_false_while_the_executor_is_down(make_server):
    srv = make_server(AIENG_MODELS="minilm").start()
    assert get(srv.http + "/readyz")[0] == 200
    os.kill(srv.child_pid("aieng::executor"), signal.SIGKILL)
    deadline = time.monotonic() + 5
    codes = []
    while time.monotonic() < deadline:
        codes.append(get(srv.http + "/readyz")[0])
        if codes[-1] == 503:
            break
        time.sleep(0.1)
    assert codes[-1] == 503, codes
    assert get(srv.http + "/healthz")[0] == 200  # liveness: a restarting executor is recovery, not death
    srv.wait_ready(60)
    deadline = time.monotonic() + 5
    while get(srv.http + "/readyz")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert get(srv.http + "/readyz")[0] == 200
    restarts = samples(srv.http)
    assert value(restarts, "aieng_worker_restarts_total", role="executor") == 1


def test_input_drift_psi_rises_when_inputs_shift(make_server):
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import random

    import train_tabular

    rows = train_tabular.load_rows()
    # the CSV is ordered by species; any prefix should look like the population
    random.Random(0).shuffle(rows)
    feats = train_tabular.NUMERIC + train_tabular.CATEGORICAL
    srv = make_server(AIENG_MODELS="tabular").start()
    with srv.client() as c:
        for r in rows[:300]:  # the population the model was trained on
            c.infer("tabular", {k: r[k] for k in feats if r[k] is not None})
    def published(ok: int) -> bool:  # a snapshot of the loop published after the ok-th answer
        code, body = get(srv.http + "/debug")
        return code == 200 and json.loads(body)["counts"]["ok"] >= ok

    def psi(feature: str) -> float:  # the collector serves what that snapshot published
        return value(samples(srv.http), "aieng_input_drift_psi", model="tabular", version="1",
                     feature=feature)

    assert until(lambda: published(300), 10)
    stable = psi("bill_length_mm")
    assert 0 < stable < 0.1, stable
    with srv.client() as c:
        for r in rows[:300]:  # the same birds, but every bill 20 mm longer and all on one island
            shifted = {k: r[k] for k in feats if r[k] is not None}
            shifted["bill_length_mm"] = (r["bill_length_mm"] or 44.0) + 20.0
            shifted["island"] = "Dream"
            c.infer("tabular", shifted)
    assert until(lambda: published(600), 10)
    # /metrics is rendered at most once per snapshot period, and 300 answers can take less than that: the
    # render right after them may be the one made before them, so wait (bounded) for one that has them
    fresh: list = []

    def bills_drifted() -> bool:
        fresh[:] = [samples(srv.http)]
        return value(fresh[0], "aieng_input_drift_psi", model="tabular", version="1",
                     feature="bill_length_mm") > 1.0

    assert until(bills_drifted, 10)
    s = fresh[0]
    assert value(s, "aieng_input_drift_psi", model="tabular", version="1", feature="island") > 0.25
    assert value(s, "aieng_input_drift_psi", model="tabular", version="1", feature="body_mass_g") < 0.1


def test_readyz_turns_false_while_a_worker_is_hung(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_HANG_TIMEOUT_S="60").start()
    pid = srv.child_pid("aieng::postprocess[0]")
    os.kill(pid, signal.SIGSTOP)  # alive to the OS, silent to everyone
    try:
        deadline = time.monotonic() + 10  # heartbeats stop; after 5 s of silence it no longer counts
        while time.monotonic() < deadline and get(srv.http + "/readyz")[0] == 200:
            time.sleep(0.2)
        assert get(srv.http + "/readyz")[0] == 503
        assert srv.health()["ready"] is False
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10  # the next heartbeat makes it ready again
    while time.monotonic() < deadline and get(srv.http + "/readyz")[0] != 200:
        time.sleep(0.2)
    assert get(srv.http + "/readyz")[0] == 200
