"""Model pool against the real server: lazy versions load on first use, LRU eviction under a budget.

Each test builds its own repository under tmp_path: ``tabular`` version 1 (eager) and lazy models
(``pool: {lazy: true}`` in their model-wide model.yaml).  The cold-load test's lazy model is made
of the demo tabular model's files, golden set included, so its cold loads run it.  The demo tabular
session costs the executor ~0.2 MiB, under the noise of an RSS measurement, so the eviction test
uses its own model: a Gather from a 32 MiB weight (``y = W[idx]``, W = 0, 1, 2, ...), whose
footprint is the weight.  Its budget is set from footprints measured by a first server without one,
and it runs with ``AIENG_POOL_WARM_S=0`` (plain LRU: the protection of warm versions is tested in
tests/e2e/test_reliability_v3_pool.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import time

import numpy as np
import psutil
import pytest

from aieng.client import AsyncClient, build_request
from tests.e2e.pool_helpers import (
    LOAD_TIMEOUT_MS,
    ask,
    gather_model,
    lazy_model,
    metric,
    pool_view,
    providers,
)
from tests.e2e.rollout_helpers import PENGUINS, base_repo, cli, copy_version, models, start

pytestmark = pytest.mark.e2e


def test_a_lazy_version_is_not_built_at_start_and_loads_on_its_first_request(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo)
    lazy_model(repo, "lazy", ["1", "2"])
    srv = start(make_server, tmp_path, repo)
    listed = models(srv)["lazy"]["versions"]
    assert (listed["1"]["load"]["state"], listed["2"]["load"]["state"]) == ("cold", "cold")
    assert pool_view(srv)["versions"]["lazy:1"]["state"] == "cold"
    assert "lazy:1" not in providers(srv) and "tabular:1" in providers(srv)  # the executor never built it

    t0 = time.monotonic()
    first = ask(srv, "first", "lazy", "1")
    took = time.monotonic() - t0
    assert (first["ok"], first["version"]) == (True, "1"), first
    assert first["outputs"]["label"] == ask(srv, "eager", "tabular", "1")["outputs"]["label"]
    deadline = time.monotonic() + 10  # the executor's heartbeat (every second or so) brings its sessions
    while "lazy:1" not in providers(srv):
        assert time.monotonic() < deadline, providers(srv)
        time.sleep(0.2)
    view = pool_view(srv)["versions"]["lazy:1"]
    assert view["state"] == "resident" and view["footprint_bytes"] > 0
    assert metric(srv, "aieng_model_cold_load_seconds_count", 1.0, model="lazy", version="1") == 1.0
    assert ask(srv, "second", "lazy", "1")["ok"]  # resident now: no second cold load
    assert metric(srv, "aieng_model_cold_load_seconds_count", 1.0, model="lazy", version="1") == 1.0
    assert models(srv)["lazy"]["versions"]["1"]["load"]["state"] == "ready"
    built = [line for line in srv.output().splitlines() if "loaded lazy:1 (" in line]
    assert len(built) == 1 and "(cold load, a request waits: at normal priority)" in built[0], built
    # its golden cases ran on the serving lanes, not the background one: still 0 after a few executor
    # heartbeats (about one a second), which would have brought a count
    seen = []
    with srv.client(timeout_s=30) as c:
        for _ in range(6):
            seen.append(c.models()["models"]["lazy"]["versions"]["1"]["onnx"]["background_runs"])
            time.sleep(0.5)
    assert seen == [0] * 6, seen
    print(f"cold load of lazy:1: {view['last_cold_load_s']:.2f}s in the server (first answer after "
          f"{took:.2f}s), executor footprint {view['footprint_bytes'] / 2**20:.1f} MiB")

    # requests arriving together for a cold version share one load; one whose deadline is shorter than
    # the load gets UNAVAILABLE saying cold start; every request gets exactly one answer
    async def together() -> list:
        client = AsyncClient(srv.addr, timeout_s=LOAD_TIMEOUT_MS / 1000 + 30)
        try:
            reqs = [build_request("short", "lazy", PENGUINS[0], version="2", timeout_ms=20)]
            reqs += [build_request(f"w{i}", "lazy", PENGUINS[i % 4], version="2", timeout_ms=LOAD_TIMEOUT_MS)
                     for i in range(6)]
            seen: dict = {}  # the pool's view of lazy:2 right after the short request's answer

            async def one(r: dict) -> dict:
                reply = await client.call(r, raise_on_error=False)
                if reply["id"] == "short":
                    peek = await client.call({"op": "models", "id": "peek"})
                    seen.update(peek["pool"]["versions"]["lazy:2"])
                return reply
            return await asyncio.gather(*(one(r) for r in reqs)), seen
        finally:
            client.close()

    answers, seen = asyncio.run(together())
    # answered at its deadline, while the others still waited for the load (not when it ended)
    assert (seen["state"], seen["waiting"]) == ("loading", 6), seen
    replies = {r["id"]: r for r in answers}
    assert sorted(replies) == ["short"] + [f"w{i}" for i in range(6)]
    short = replies.pop("short")
    assert short["ok"] is False and short["error"]["code"] == "UNAVAILABLE", short
    assert "cold start" in short["error"]["message"] and "lazy:2" in short["error"]["message"]
    assert [(r["ok"], r["version"]) for r in replies.values()] == [(True, "2")] * 6, replies
    assert metric(srv, "aieng_model_cold_load_seconds_count", 1.0, model="lazy", version="2") == 1.0
    assert metric(srv, "aieng_model_evictions_total", 0.0, model="lazy", version="1") == 0.0  # no budget
    after = pool_view(srv)["versions"]["lazy:2"]
    assert (after["state"], after["waiting"]) == ("resident", 0), after


def test_cold_waiters_are_bounded_per_version_and_a_failed_cold_load_says_why(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo)
    lazy_model(repo, "lazy", ["1"])
    lazy_model(repo, "broken", ["1"])  # its golden set expects a label the model never gives
    gpath = repo / "broken" / "1" / "golden.json"
    golden = json.loads(gpath.read_text())
    for case in golden["cases"]:
        case["expected"]["label"] = "Nobody"
    gpath.write_text(json.dumps(golden))
    srv = start(make_server, tmp_path, repo, AIENG_MAX_INFLIGHT="2")  # at most 2 wait per version

    async def burst() -> list:
        clients = [AsyncClient(srv.addr, timeout_s=LOAD_TIMEOUT_MS / 1000 + 30) for _ in range(4)]
        reqs = [build_request(f"b{i}", "lazy", PENGUINS[0], version="1", timeout_ms=LOAD_TIMEOUT_MS)
                for i in range(4)]
        try:  # one client each: the per-client in-flight limit (1 here) is not what refuses
            return await asyncio.gather(*(c.call(r, raise_on_error=False) for c, r in zip(clients, reqs)))
        finally:
            for c in clients:
                c.close()

    replies = {r["id"]: r for r in asyncio.run(burst())}
    assert sorted(replies) == ["b0", "b1", "b2", "b3"]
    codes = sorted("OK" if r["ok"] else r["error"]["code"] for r in replies.values())
    assert codes == ["OK", "OK", "OVERLOADED", "OVERLOADED"], replies
    refused = next(r for r in replies.values() if not r["ok"])
    assert "cold start" in refused["error"]["message"] and "2 requests wait" in refused["error"]["message"]
    assert ask(srv, "after", "lazy", "1")["ok"]

    # a cold load that fails (here: its golden set) answers its waiters UNAVAILABLE with the reason; the
    # version stays cold and the next request tries again
    for attempt in ("f1", "f2"):
        failed = ask(srv, attempt, "broken", "1")
        assert failed["ok"] is False and failed["error"]["code"] == "UNAVAILABLE", failed
        message = failed["error"]["message"]
        assert "broken:1 could not be loaded (cold start)" in message and "golden case" in message, message
        assert pool_view(srv)["versions"]["broken:1"]["state"] == "cold"
        deadline = time.monotonic() + 30  # its other golden cases still run and count against the 2 in flight
        while srv.health()["in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert metric(srv, "aieng_version_loads_total", 2.0, model="broken", version="1", outcome="failed") == 2.0
    assert metric(srv, "aieng_model_cold_load_seconds_count", 0.0, model="broken", version="1") == 0.0
    deadline = time.monotonic() + 10  # released in the executor (its next heartbeat says so)
    while "broken:1" in providers(srv):
        assert time.monotonic() < deadline, providers(srv)
        time.sleep(0.2)


def measure_footprints(make_server, tmp_path, repo) -> dict[str, int]:
    """Each lazy version's executor footprint, cold-loaded once by a server without a budget."""
    (tmp_path / "measure").mkdir()
    srv = start(make_server, tmp_path / "measure", repo)
    try:
        for key in ("big:1", "big:2", "pinned:1"):
            name, version = key.split(":")
            assert ask(srv, f"m-{key}", name, version)["ok"]
        view = pool_view(srv)["versions"]
        return {k: view[k]["footprint_bytes"] for k in ("big:1", "big:2", "pinned:1")}
    finally:
        assert srv.stop() == 0
        assert srv.segments() == []


def test_a_budget_evicts_the_least_recently_used_version_and_never_a_pinned_one(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo)
    gather_model(repo, "big", ["1", "2"])
    gather_model(repo, "pinned", ["1"], pinned=True)
    sizes = measure_footprints(make_server, tmp_path, repo)
    biggest, smallest = max(sizes.values()), min(sizes.values())
    budget = biggest * 3 // 2  # any one fits, any two do not (checked next: else the test proves nothing)
    print(f"measured footprints (MiB): { {k: round(v / 2**20, 1) for k, v in sizes.items()} }; "
          f"budget {budget / 2**20:.1f} MiB")
    assert smallest * 2 > budget, f"footprints too uneven for a one-version budget: {sizes}"

    # plain LRU (no warm protection): each request evicts the version used just before it
    srv = start(make_server, tmp_path, repo, AIENG_MODEL_MEMORY_BUDGET=str(budget), AIENG_POOL_WARM_S="0")
    executor = psutil.Process(srv.child_pid("aieng::executor"))
    rss, evictions = [], {"1": 0, "2": 0}
    for cycle in range(10):
        for v, other in (("1", "2"), ("2", "1")):
            reply = ask(srv, f"c{cycle}-{v}", "big", v)
            assert (reply["ok"], reply["version"]) == (True, v), reply
            assert np.asarray(reply["outputs"]["y"]).tolist() == [0.0, 1.0, 5.0, 8e6], reply["outputs"]
            view = pool_view(srv)["versions"]
            assert (view[f"big:{v}"]["state"], view[f"big:{other}"]["state"]) == (
                "resident", "cold" if cycle == 0 and v == "1" else "evicted"), view
            if not (cycle == 0 and v == "1"):
                evictions[other] += 1
            count = metric(srv, "aieng_model_evictions_total", evictions[other], model="big", version=other)
            assert count == evictions[other]
        rss.append(executor.memory_info().rss)
    cold = metric(srv, "aieng_model_cold_load_seconds_count", 10.0, model="big", version="1")
    seconds = metric(srv, "aieng_model_cold_load_seconds_sum", None, model="big", version="1")
    print(f"20 alternating requests, 19 evictions; big:1 cold loads {cold:.0f}, mean "
          f"{seconds / cold:.2f}s; executor RSS per cycle (MiB): {[round(r / 2**20, 1) for r in rss]}")
    assert cold == 10.0
    # memory freed by an eviction is reused by the next load: no growth beyond one footprint + 16 MiB
    assert rss[-1] - rss[1] < biggest + 16 * 2**20, rss

    # the pinned model loads by evicting the resident lazy version, then is never evicted
    assert ask(srv, "pin", "pinned", "1")["ok"]
    view = pool_view(srv)["versions"]
    assert (view["pinned:1"]["state"], view["big:2"]["state"]) == ("resident", "evicted")
    refused = ask(srv, "refused", "big", "1")
    assert refused["ok"] is False and refused["error"]["code"] == "UNAVAILABLE", refused
    assert "AIENG_MODEL_MEMORY_BUDGET" in refused["error"]["message"]
    assert f"budget is {budget} bytes" in refused["error"]["message"]
    view = pool_view(srv)["versions"]
    assert (view["pinned:1"]["state"], view["pinned:1"]["evictions"]) == ("resident", 0)
    assert ask(srv, "pin-again", "pinned", "1")["ok"]
    assert metric(srv, "aieng_model_evictions_total", 0.0, model="pinned", version="1") == 0.0


def test_run_time_load_reports_the_executor_footprint(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo, with_minilm=True)
    srv = start(make_server, tmp_path, repo)
    vdir = copy_version(repo, "minilm", "2", src_version="1")  # same weights: its golden set passes
    weights = os.path.getsize(os.path.join(vdir, "model.onnx"))
    code, out, err = cli(srv, "models", "load", "minilm", "2")
    assert code == 0, err + out
    load = models(srv)["minilm"]["versions"]["2"]["load"]
    assert load["state"] == "ready"
    executor = [n for n in load["footprint_bytes"] if "executor" in n]
    assert len(executor) == 1, load["footprint_bytes"]
    footprint = load["footprint_bytes"][executor[0]]
    print(f"minilm session footprint: executor RSS +{footprint / 2**20:.1f} MiB for a "
          f"{weights / 2**20:.1f} MiB model file; every worker: {load['footprint_bytes']}")
    # ONNX Runtime holds the weights in memory: the session costs at least half the file's size
    assert footprint > weights // 2
