"""Issue 36: a team's own Python as a model's preprocessing, served by the real server.

``tabhook`` is the tabular demo's ONNX file and state behind a ``model.py`` that does what the built-in
tabular processor does (the same features from the same inputs), with the demo's built-in ``classify``
postprocessing: its answers equal the built-in ``tabular`` model's, natively and over OIP (HTTP and gRPC,
tritonclient), and under load they are batched (``batch`` > 1) with the hook written per request;
``tabbatch``, the same class with ``batch``, is called with several requests a worker drained together.  Its
``mode`` input makes the hook misbehave: ``value`` raises ValueError (INVALID_INPUT with the message), ``bug``
a KeyError (INTERNAL "KeyError: ...", the traceback logged), ``wrong`` returns a tensor of the wrong shape
(INTERNAL naming the hook), ``crash`` calls ``os._exit(1)`` and ``hang`` sleeps far past every limit: each
fails its own request, a crashed or stuck worker is replaced, and the other requests are answered OK (a crash
or a hang past the budget gets a second try alone, so it costs two workers: test_hook_second_try.py).
Without AIENG_ALLOW_MODEL_CODE the server does not start and says why in one line.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading

import numpy as np
import pytest

from aieng.client import AsyncClient
from tests.conftest import MODELS, ServerProcess
from tests.e2e.tabular_oip import tabular_inputs
from tests.waits import until

pytestmark = pytest.mark.e2e

HOOK = '''"""The tabular demo's preprocessing as user code: preprocess.json's fills, clips, one-hots."""
import json
import math
import os
import time

import numpy as np


class Pre:
    def __init__(self, spec):
        with open(os.path.join(spec.dir, spec.params["state"]), encoding="utf-8") as fh:
            state = json.load(fh)
        self.numeric = state["numeric"]
        self.categorical = [(c["name"], {v: i for i, v in enumerate(c["categories"])})
                            for c in state["categorical"]]
        self.width = len(self.numeric) + sum(len(index) + 1 for _, index in self.categorical)

    def __call__(self, inputs):
        mode = inputs.get("mode")
        if mode == "crash":
            os._exit(1)
        if mode == "hang":
            time.sleep(600)
        if mode == "value":
            raise ValueError("mode 'value' is refused")
        if mode == "bug":
            return {}["features"]
        if mode == "wrong":
            return {"features": np.zeros(3, np.float32)}
        vec = np.zeros(self.width, dtype=np.float32)
        for i, f in enumerate(self.numeric):
            v = inputs.get(f["name"])
            if v is None or (isinstance(v, float) and math.isnan(v)):
                v = f["fill"]
            lo, hi = f["clip"]
            vec[i] = (min(max(float(v), lo), hi) - f["mean"]) / f["std"]
        pos = len(self.numeric)
        for name, index in self.categorical:
            vec[pos + index.get(inputs.get(name), len(index))] = 1.0
            pos += len(index) + 1
        return {"features": vec}
'''
# the same class with ``batch``: the worker hands it what it drained together; it says how many on stderr
BATCH = HOOK + '''
    def batch(self, many):
        import sys
        print(f"tabbatch: batch of {len(many)}", file=sys.stderr, flush=True)
        return [self(inputs) for inputs in many]
'''
NUMBERS = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]


def hook_repo(tmp_path, timeout_ms: int = 5000) -> str:
    """``tabular`` (the demo's version 1) and ``tabhook`` (its files, the hook's model.yaml and model.py)."""
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(MODELS, "tabular", "1"), repo / "tabular" / "1")
    d = repo / "tabhook" / "1"
    d.mkdir(parents=True)
    for f in ("model.onnx", "preprocess.json", "labels.json"):
        shutil.copy(os.path.join(MODELS, "tabular", "1", f), d / f)
    (d / "model.py").write_text(HOOK)
    (d / "model.yaml").write_text(
        "inputs:\n" + "".join(f"  - {{name: {n}, kind: number, optional: true}}\n" for n in NUMBERS)
        + "  - {name: island, kind: category, optional: true}\n"
          "  - {name: sex, kind: category, optional: true}\n"
          "  - {name: mode, kind: category, optional: true}\n"
          "outputs:\n  - {name: label, kind: str}\n"
          "  - {name: probabilities, kind: tensor, dtype: float32, shape: [3]}\n"
          "preprocess: {type: python, entry: \"model.py:Pre\", state: preprocess.json}\n"
          "postprocess: {type: classify, source: probabilities, activation: none,\n"
          "              labels: {file: labels.json}, label_output: label, scores_output: probabilities}\n"
          f"batching: {{max_batch_size: 64, max_wait_ms: 2}}\ntimeout_ms: {timeout_ms}\n")
    shutil.copytree(d, repo / "tabbatch" / "1")
    (repo / "tabbatch" / "1" / "model.py").write_text(BATCH)
    return str(repo)


def rows(n: int = 40) -> list[dict]:
    with open(os.path.join(MODELS, "tabular", "1", "reference.json")) as fh:
        cases = [c["input"] for c in json.load(fh)["cases"]]
    rng = np.random.default_rng(5)
    out = [dict(c) for c in cases]
    while len(out) < n:  # more rows: the reference's with numbers moved, some missing, an unknown island
        r = dict(cases[len(out) % len(cases)])
        for k in NUMBERS:
            r[k] = None if rng.random() < 0.1 else float(rng.normal(1.0, 0.1) * (r.get(k) or 40.0))
        if rng.random() < 0.1:
            r["island"] = "Atlantis"
        out.append(r)
    return out[:n]


def outcome(reply: dict) -> tuple:
    return ("OK",) if reply["ok"] else (reply["error"]["code"], reply["error"]["message"])


async def together(addr: str, model: str, inputs: list[dict]) -> list[dict]:
    client = AsyncClient(addr, timeout_s=60)
    try:
        return await asyncio.gather(*(client.call({"op": "infer", "model": model, "inputs": i},
                                                  raise_on_error=False) for i in inputs))
    finally:
        client.close()


def test_the_hook_answers_as_the_builtin_natively_over_oip_and_batched(make_server, tmp_path):
    srv = make_server(AIENG_MODEL_REPOSITORY=hook_repo(tmp_path), AIENG_ALLOW_MODEL_CODE="1",
                      AIENG_PREPROCESS_WORKERS="2").start()
    sample = rows()
    with srv.client() as c:
        for r in sample:
            want, got = c.infer("tabular", r), c.infer("tabhook", r)
            assert got["outputs"]["label"] == want["outputs"]["label"]
            np.testing.assert_allclose(got["outputs"]["probabilities"], want["outputs"]["probabilities"],
                                       atol=1e-6)
        errors = {m: c.call({"op": "infer", "model": "tabhook", "inputs": {"mode": m}}, raise_on_error=False)
                  for m in ("value", "bug", "wrong")}
        served = c.call({"op": "models"})
    assert {m: outcome(r) for m, r in errors.items()} == {
        "value": ("INVALID_INPUT", "mode 'value' is refused"),
        "bug": ("INTERNAL", "KeyError: 'features'"),
        "wrong": ("INTERNAL",
                  "model.py:Pre returned 'features' of shape [3]; the graph takes [11] per request")}
    failed = "model.py:Pre failed for request"
    logged = until(lambda: [r for r in srv.records() if failed in r.get("msg", "")], 5)
    assert len(logged) == 1 and logged[0]["trace"], logged  # the bug's, with its trace id
    assert "Traceback" in logged[0]["msg"] and 'return {}["features"]' in logged[0]["msg"]
    assert served["ok"]

    # under load: batched by the server, the hook called per request, every answer its own row's
    many = rows(96)  # under the per-client limit (half of AIENG_MAX_INFLIGHT)
    replies = asyncio.run(together(srv.addr, "tabhook", many))
    assert all(r["ok"] for r in replies), [outcome(r) for r in replies if not r["ok"]][:3]
    assert max(r["batch"] for r in replies) > 1, "never batched: the test proves nothing"
    builtin = asyncio.run(together(srv.addr, "tabular", many))
    for got, want in zip(replies, builtin):
        np.testing.assert_allclose(got["outputs"]["probabilities"], want["outputs"]["probabilities"],
                                   atol=1e-6)
    # with ``batch``: called with what a worker drained together, the same answers
    sizes: list[int] = []
    for _ in range(5):  # a round whose drains all held one request is possible: up to five rounds of 96
        batched = asyncio.run(together(srv.addr, "tabbatch", many))
        assert [r["outputs"]["label"] for r in batched] == [r["outputs"]["label"] for r in builtin]
        sizes = [int(line.rsplit(" ", 1)[1]) for line in srv.output().splitlines()
                 if line.startswith("tabbatch: batch of ")]
        if max(sizes, default=0) > 1:
            break
    assert sizes and max(sizes) > 1, sizes

    import tritonclient.grpc as tg
    import tritonclient.http as th

    http, grpc = th.InferenceServerClient(srv.oip_http), tg.InferenceServerClient(srv.oip_grpc)
    try:
        for mod, client in ((th, http), (tg, grpc)):
            assert client.is_model_ready("tabhook")
            got = {m: oip_infer(mod, client, m, sample[:6]) for m in ("tabular", "tabhook")}
            assert list(got["tabhook"][0]) == list(got["tabular"][0])
            np.testing.assert_allclose(got["tabhook"][1], got["tabular"][1], atol=1e-6)
    finally:
        http.close()
        grpc.close()


def oip_infer(mod, client, model: str, sample: list[dict]):
    res = client.infer(model, tabular_inputs(mod, sample))
    return res.as_numpy("label"), res.as_numpy("probabilities")


class Stream:
    """Good requests one after another on a connection of their own until ``stop``: what is in flight
    beside a request that crashes or hangs its worker."""

    def __init__(self, addr: str):
        self.addr, self.replies, self.stop = addr, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        from aieng.client import Client

        sample = rows()
        with Client(self.addr, timeout_s=60) as c:
            while not self.stop.is_set():
                r = sample[len(self.replies) % len(sample)]
                self.replies.append(c.call({"op": "infer", "model": "tabhook", "inputs": r},
                                           raise_on_error=False))

    def until(self, n: int) -> None:
        assert until(lambda: len(self.replies) >= n, 30), len(self.replies)

    def end(self) -> list:
        self.stop.set()
        self.thread.join(60)
        return [outcome(r) for r in self.replies]


def preprocess_pids(srv) -> dict[str, int]:
    return {n: p["pid"] for n, p in srv.health()["processes"].items() if p["role"] == "preprocess"}


def test_a_crash_or_a_hang_fails_only_its_request_and_the_worker_is_replaced(make_server, tmp_path):
    # three workers: once the hung one is stalled (1.5 s), a model that stalls one may not take the last
    # free worker (workers.pick_pre, issue 33's rule for other models' sake); with two free it takes them
    srv = make_server(AIENG_MODEL_REPOSITORY=hook_repo(tmp_path, timeout_ms=20000),
                      AIENG_ALLOW_MODEL_CODE="1", AIENG_PREPROCESS_WORKERS="3",
                      AIENG_PREPROCESS_BUDGET_MS="2000").start()
    before = preprocess_pids(srv)
    stream = Stream(srv.addr)
    stream.until(20)
    with srv.client(timeout_s=60) as c:
        crashed = c.call({"op": "infer", "model": "tabhook", "inputs": {"mode": "crash"}},
                         raise_on_error=False)
        # two restarts: its worker, then the one its second try ran on (frontend/requests/retries.py)
        assert until(lambda: srv.health()["restarts"].get("preprocess", 0) == 2
                     and srv.health()["ready"], 30)
        n = len(stream.replies)
        stream.until(n + 20)  # the stream goes on through the restart
        hung = c.call({"op": "infer", "model": "tabhook", "inputs": {"mode": "hang"}}, raise_on_error=False)
        assert len(stream.replies) > n + 20, "nothing was answered while the hook hung"
        stream.until(len(stream.replies) + 20)
    replies = stream.end()
    assert outcome(crashed)[0] == "UNAVAILABLE" and "exited (code 1)" in outcome(crashed)[1], crashed
    assert outcome(hung)[0] == "UNAVAILABLE", hung
    assert "AIENG_PREPROCESS_BUDGET_MS (2000 ms)" in outcome(hung)[1], hung
    assert replies == [("OK",)] * len(replies) and len(replies) >= 60
    # the workers its second try cost: "pre-N exited ...", "pre-N was"
    lost = {outcome(crashed)[1].split()[0], outcome(hung)[1].split()[0]}

    def replaced() -> dict | None:  # each worker lost alive again in a new process, the server ready
        h = srv.health()
        procs = h["processes"]
        new = all(procs[w]["alive"] and procs[w]["pid"] != before[w] for w in lost)
        return h if h["ready"] and new and h["restarts"].get("preprocess", 0) == 4 else None

    assert until(replaced, 30), (lost, before, srv.health())
    with srv.client() as c:  # the replaced workers serve the hook again
        assert c.infer("tabhook", rows(1)[0])["outputs"]["label"]


def test_without_the_variable_the_start_fails_naming_it(tmp_path):
    srv = ServerProcess(tmp_path, AIENG_MODEL_REPOSITORY=hook_repo(tmp_path))
    srv.start(wait=False)
    try:
        code = srv.proc.wait(60)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert code == 1  # a model that does not load: the start-failure code (serve)
    lines = [ln for ln in srv.output().splitlines() if "AIENG_ALLOW_MODEL_CODE" in ln]
    assert lines and "set AIENG_ALLOW_MODEL_CODE=1 to allow it" in lines[0], srv.output()[-2000:]
    assert "/1/model.yaml" in lines[0]  # the version it names (the first in the scan: tabbatch)


def test_a_hang_past_the_models_timeout_answers_timeout_and_its_worker_is_replaced(make_server, tmp_path):
    # timeout_ms (1 s) under the budget (2 s): the request is answered TIMEOUT while its worker still runs
    # the hook; that worker counts as busy (an answered request it works on) and is replaced at the
    # budget, not at AIENG_HANG_TIMEOUT_S (60 s here), and no other request is routed behind it
    srv = make_server(AIENG_MODEL_REPOSITORY=hook_repo(tmp_path, timeout_ms=1000),
                      AIENG_ALLOW_MODEL_CODE="1", AIENG_PREPROCESS_WORKERS="3",
                      AIENG_PREPROCESS_BUDGET_MS="2000", AIENG_HANG_TIMEOUT_S="60").start()
    stream = Stream(srv.addr)
    stream.until(20)
    with srv.client(timeout_s=60) as c:
        hung = c.call({"op": "infer", "model": "tabhook", "inputs": {"mode": "hang"}}, raise_on_error=False)
    assert outcome(hung) == ("TIMEOUT", "no answer within the deadline (stage: preprocess)")
    assert until(lambda: srv.health()["restarts"].get("preprocess", 0) == 1, 20), srv.health()
    stream.until(len(stream.replies) + 20)
    replies = stream.end()
    assert replies == [("OK",)] * len(replies)
    assert "AIENG_PREPROCESS_BUDGET_MS (2000 ms): stuck, replacing it" in srv.output()
