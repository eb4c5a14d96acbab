"""Hot swap against the real server: run-time load gated by a golden set, unload drains, reload rescans.

Each test builds its own model repository under tmp_path: ``tabular`` version 1 (the demo model's
files) and, at run time, a version 2 directory made from the same files, with a golden set generated
from version 1's real answers (so version 2 must reproduce them).  The broken version is version 1
with its labels permuted: its golden set must refuse it.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
import time

import psutil
import pytest

from aieng.client import AsyncClient, Client, build_request
from tests.e2e.rollout_helpers import (
    PENGUINS,
    base_repo,
    cli,
    copy_version,
    executor_pid,
    models,
    srv_metrics,
    start,
)
from tests.waits import until

pytestmark = pytest.mark.e2e


def golden_from(srv, vdir: str) -> None:
    """A golden set for ``vdir`` made of version 1's real answers to PENGUINS."""
    with srv.client(timeout_s=30) as c:
        cases = []
        for inputs in PENGUINS:
            r = c.infer("tabular", inputs, version="1")
            probs = r["outputs"]["probabilities"]
            cases.append({"inputs": inputs, "expected": {"label": r["outputs"]["label"],
                                                         "probabilities": probs.tolist()}})
    with open(os.path.join(vdir, "golden.json"), "w") as fh:
        json.dump({"atol": 1e-4, "cases": cases}, fh)


def pinned(srv, version: str) -> dict:
    with srv.client(timeout_s=30) as c:
        return c.call(build_request("p", "tabular", PENGUINS[0], version=version), raise_on_error=False)


class Load:
    """A bounded background load: AsyncClient loops on ``models``, recording every reply and latency."""

    def __init__(self, srv, targets: list[tuple[str, dict]], max_requests: int = 20_000, max_s: float = 120):
        self.srv, self.targets, self.max_requests, self.max_s = srv, targets, max_requests, max_s
        self.stop = threading.Event()
        self.replies: list[tuple[float, float, str, dict]] = []  # (sent, latency, model, reply)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.run()), daemon=True)

    async def run(self) -> None:
        client = AsyncClient(self.srv.addr, timeout_s=30)
        end = time.monotonic() + self.max_s

        async def worker(w: int) -> None:
            i = 0
            while not self.stop.is_set() and time.monotonic() < end and len(self.replies) < self.max_requests:
                model, inputs = self.targets[(w + i) % len(self.targets)]
                i += 1
                t0 = time.monotonic()
                r = await client.call(build_request(f"{w}-{i}", model, inputs), raise_on_error=False)
                self.replies.append((t0, time.monotonic() - t0, model, r))

        try:
            await asyncio.gather(*(worker(w) for w in range(4)))
        finally:
            client.close()

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)


def p99(latencies: list[float]) -> float:
    xs = sorted(latencies)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else float("nan")


def test_load_under_load_serves_without_failures_and_golden_set_gates_routing(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo, with_minilm=True)
    srv = start(make_server, tmp_path, repo)
    vdir = copy_version(repo, "tabular", "2")
    golden_from(srv, vdir)
    assert pinned(srv, "2")["error"]["code"] == "MODEL_NOT_FOUND"  # a directory alone is not served
    targets = [("minilm", {"text": "a steady stream of sentences to embed"}), ("tabular", PENGUINS[1])]
    with Load(srv, targets) as load:
        time.sleep(3.0)
        swap_start = time.monotonic()
        code, out, err = cli(srv, "models", "load", "tabular", "2")
        swap_end = time.monotonic()
        time.sleep(1.0)
    assert code == 0, err + out
    assert json.loads(out)["load"]["state"] == "ready"
    failed = [r for _, _, _, r in load.replies if not r["ok"]]
    assert failed == [], failed[:3]
    assert len(load.replies) > 100
    steady = [lat for t, lat, mdl, _ in load.replies if mdl == "minilm" and t < swap_start]
    during = [lat for t, lat, mdl, _ in load.replies if mdl == "minilm" and swap_start <= t <= swap_end]
    print(f"minilm p99 steady {p99(steady) * 1000:.1f} ms ({len(steady)} requests), during the swap "
          f"{p99(during) * 1000:.1f} ms ({len(during)} requests, swap took {swap_end - swap_start:.2f}s)")
    v2 = models(srv)["tabular"]["versions"]["2"]
    assert (v2["weight"], v2["load"]["state"], v2["load"]["golden_cases"]) == (0.0, "ready", len(PENGUINS))
    built = [line for line in srv.output().splitlines() if "loaded tabular:2 (" in line]
    assert len(built) == 1 and "(beside serving: at idle priority, warm-up paced)" in built[0], built
    # the golden cases ran on the executor's background lane, at most GOLDEN_WINDOW (2) rows a batch; the
    # count comes with the executor's heartbeat
    least, deadline = -(-len(PENGUINS) // 2), time.monotonic() + 10
    with srv.client(timeout_s=30) as c:
        while (onnx := c.models()["models"]["tabular"]["versions"]["2"]["onnx"])["background_runs"] < least:
            assert time.monotonic() < deadline, onnx
            time.sleep(0.2)
    assert least <= onnx["background_runs"] <= len(PENGUINS), onnx
    reply = pinned(srv, "2")
    assert (reply["ok"], reply["version"]) == (True, "2")
    code, _, err = cli(srv, "rollout", "set-weights", "tabular", "1=50", "2=50")
    assert code == 0, err
    events = [e["kind"] for e in json.loads(cli(srv, "rollout", "status", "tabular", "--json")[1])
              ["models"]["tabular"]["events"]]
    assert "loaded" in events


def test_golden_failure_leaves_the_old_version_serving(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo)
    srv = start(make_server, tmp_path, repo)
    vdir = copy_version(repo, "tabular", "2")
    golden_from(srv, vdir)
    labels = json.load(open(os.path.join(vdir, "labels.json")))
    assert isinstance(labels, list) and len(labels) == 3
    with open(os.path.join(vdir, "labels.json"), "w") as fh:  # the broken version: labels permuted
        json.dump(labels[1:] + labels[:1], fh)
    code, out, err = cli(srv, "models", "load", "tabular", "2")
    assert code == 1, out
    load = json.loads(out)["load"]
    assert load["state"] == "failed" and "golden case" in load["error"] and "label" in load["error"], load
    assert pinned(srv, "2")["error"]["code"] == "MODEL_NOT_FOUND"
    code, _, err = cli(srv, "rollout", "set-weights", "tabular", "1=50", "2=50")
    assert code == 1 and "unknown version" in err
    reply = pinned(srv, "1")
    assert (reply["ok"], reply["version"]) == (True, "1")
    code, out, _ = cli(srv, "rollout", "status", "tabular")
    assert "version 2: failed" in out and "golden case" in out
    metrics = srv_metrics(srv)
    assert 'aieng_version_loads_total{model="tabular",outcome="failed",version="2"} 1.0' in metrics
    assert "loading tabular:2 failed, it stays unroutable: golden case" in srv.output()


def test_unload_drains_in_flight_requests_and_refuses_a_weighted_version(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo)
    copy_version(repo, "tabular", "2")  # no golden set: routable once loaded
    srv = start(make_server, tmp_path, repo)  # both versions at start; weights 100 on 1
    code, _, err = cli(srv, "rollout", "set-weights", "tabular", "1=0", "2=100")
    assert code == 0, err
    code, _, err = cli(srv, "models", "unload", "tabular", "2")
    assert code == 1 and "set it to 0" in err
    assert cli(srv, "rollout", "set-weights", "tabular", "1=100", "2=0")[0] == 0
    executor = psutil.Process(srv.child_pid("aieng::executor"))

    async def pinned_burst(n: int) -> list:
        client = AsyncClient(srv.addr, timeout_s=30)
        try:
            return await asyncio.gather(*(client.call(build_request(f"d{i}", "tabular", PENGUINS[i % 4],
                                                                    version="2"), raise_on_error=False)
                                          for i in range(n)))
        finally:
            client.close()

    results: list = []
    executor.suspend()  # the requests pile up in flight: the unload must wait for them
    try:
        burst = threading.Thread(target=lambda: results.extend(asyncio.run(pinned_burst(8))))
        burst.start()
        with Client(srv.addr, timeout_s=10) as c:  # all eight held in flight by the suspended executor
            assert until(lambda: c.health()["in_flight"] == 8, 30)
        code, out, err = cli(srv, "models", "unload", "tabular", "2", "--no-wait")
        assert code == 0, err
        started = json.loads(out)
        assert (started["load"]["state"], started["in_flight"]) == ("draining", 8)
        assert models(srv)["tabular"]["versions"]["2"]["load"]["state"] == "draining"
    finally:
        executor.resume()
    burst.join(30)
    assert [(r["ok"], r["version"]) for r in results] == [(True, "2")] * 8
    deadline = time.monotonic() + 10
    while models(srv)["tabular"]["versions"]["2"]["load"]["state"] != "unloaded":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert pinned(srv, "2")["error"]["code"] == "MODEL_NOT_FOUND"
    assert "unloaded tabular:2" in srv.output()


def test_sighup_loads_a_new_directory_and_unloads_a_removed_one(make_server, tmp_path):
    repo = tmp_path / "repo"
    base_repo(repo)
    srv = start(make_server, tmp_path, repo)
    vdir = copy_version(repo, "tabular", "2")
    golden_from(srv, vdir)
    os.kill(srv.pid, signal.SIGHUP)
    deadline = time.monotonic() + 60
    while (models(srv)["tabular"]["versions"].get("2", {}).get("load") or {}).get("state") != "ready":
        assert time.monotonic() < deadline, models(srv)
        time.sleep(0.3)
    assert models(srv)["tabular"]["versions"]["2"]["load"]["source"] == "reload"
    assert pinned(srv, "2")["ok"]
    old = srv.child_pid("aieng::executor")  # a restarted executor comes up with the run-time loaded version
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not (executor_pid(srv) not in (None, old) and (srv.health() or {}).get("ready")):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    reply = pinned(srv, "2")
    assert (reply["ok"], reply["version"]) == (True, "2"), reply
    shutil.rmtree(vdir)
    os.kill(srv.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while models(srv)["tabular"]["versions"]["2"]["load"]["state"] != "unloaded":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert pinned(srv, "2")["error"]["code"] == "MODEL_NOT_FOUND"
    assert pinned(srv, "1")["ok"]


def test_load_unload_cycles_keep_the_executor_rss_bounded(make_server, tmp_path):
    """A few cycles here (docs/bench/hotswap_measure.py runs 50 and prints the figure)."""
    repo = tmp_path / "repo"
    base_repo(repo)
    srv = start(make_server, tmp_path, repo)
    vdir = copy_version(repo, "tabular", "2")
    golden_from(srv, vdir)
    executor = psutil.Process(srv.child_pid("aieng::executor"))
    rss = []
    for _ in range(8):
        assert cli(srv, "models", "load", "tabular", "2")[0] == 0
        assert pinned(srv, "2")["ok"]
        assert cli(srv, "models", "unload", "tabular", "2")[0] == 0
        rss.append(executor.memory_info().rss)
    growth = (rss[-1] - rss[1]) / 2**20
    print(f"executor RSS after each cycle (MiB): {[round(r / 2**20, 1) for r in rss]}")
    assert growth < 20, rss
