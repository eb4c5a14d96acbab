"""A team's own postprocessing in Python (issue 36), against the real server.

``tabular_py`` is a copy of the tabular demo (its ONNX, preprocessing and labels) whose postprocess is
``{type: python, entry: "post.py:Post"}``: user code that does what the demo's ``classify`` op does
(argmax, label from labels.json, the scores), so its answers must equal the built-in ``tabular``'s on the
same inputs, over the native client and both OIP transports.  Its params steer the hook for the fault
cases (a ValueError, another exception, ``os._exit``, a busy loop past the step's limit): each fails only
its own request, and every other request in flight meanwhile is answered OK.  A start without
AIENG_ALLOW_MODEL_CODE fails with one line naming it.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th

from aieng.client import AsyncClient, Client
from tests.conftest import MODELS, ServerProcess
from tests.e2e.tabular_oip import tabular_inputs
from tests.waits import until

pytestmark = pytest.mark.e2e
ATOL = 1e-6
LIMIT_MS = 400  # tabular_py's postprocess step limit

POST_PY = '''
import json, os, time
import numpy as np

# where this code is imported: one file per process (the test reads them; never the version directory,
# whose content hash the executor checks)
open(os.path.join(os.environ["POSTHOOK_MARKS"], str(os.getpid())), "w").close()
BUILT = [0]
WHICH = "v1"


class Post:
    """The tabular demo's classify op as user code, plus test switches read from the request's params."""

    def __init__(self, spec):
        with open(os.path.join(spec.dir, spec.params["labels"])) as fh:
            self.labels = json.load(fh)
        BUILT[0] += 1
        self.serial = BUILT[0]

    def post(self, outputs, inputs, params):
        if "exit_after_s" in params:
            time.sleep(float(params["exit_after_s"]))
            os._exit(3)
        if params.get("spin"):
            while True:
                pass
        if params.get("bad"):
            raise ValueError("the hook refuses: " + params["bad"])
        if params.get("boom"):
            raise KeyError("boom")
        scores = outputs["probabilities"].reshape(-1).astype(np.float32)
        out = {"label": self.labels[int(np.argmax(scores))], "probabilities": scores}
        if params.get("serial"):
            out["serial"] = self.serial
        if params.get("which"):
            out["which"] = WHICH
        if params.get("echo"):  # the request's own inputs, as the wire decoded them
            out["echo"] = {k: inputs[k] for k in sorted(inputs)}
        return out
'''


def hook_model(repo) -> None:
    d = repo / "tabular_py" / "1"
    shutil.copytree(os.path.join(MODELS, "tabular", "1"), d)
    text = (d / "model.yaml").read_text()
    start = text.index("postprocess:")
    end = text.index("batching:")
    (d / "model.yaml").write_text(
        text[:start] + "postprocess: {type: python, entry: \"post.py:Post\", labels: labels.json, "
        f"timeout_ms: {LIMIT_MS}}}\n" + text[end:])
    (d / "post.py").write_text(POST_PY)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("posthook") / "repo"
    repo.mkdir()
    shutil.copytree(os.path.join(MODELS, "tabular"), repo / "tabular")
    hook_model(repo)
    return repo


@pytest.fixture(scope="module")
def marks(tmp_path_factory):
    return tmp_path_factory.mktemp("posthook_marks")


@pytest.fixture(scope="module")
def srv(repo, marks, tmp_path_factory):
    # three postprocess workers: a request is routed to the least-loaded one, so while one worker holds the
    # crashing request the two streams below never queue behind it (what that worker holds fails with it)
    server = ServerProcess(tmp_path_factory.mktemp("posthook_srv"), AIENG_MODEL_REPOSITORY=str(repo),
                           AIENG_ALLOW_MODEL_CODE="1", AIENG_POSTPROCESS_WORKERS="3",
                           AIENG_LOG_FORMAT="json", POSTHOOK_MARKS=str(marks)).start()
    yield server
    assert server.stop() == 0, server.output()
    assert server.segments() == [], "shared memory left behind after a clean stop"


def rows() -> list[dict]:
    with open(os.path.join(MODELS, "tabular", "1", "reference.json")) as fh:
        return [case["input"] for case in json.load(fh)["cases"]][:8]


def test_the_hook_answers_as_the_builtin_chain_native(srv):
    with srv.client() as c:
        for row in rows():
            want, got = c.infer("tabular", row), c.infer("tabular_py", row)
            assert got["outputs"]["label"] == want["outputs"]["label"]
            np.testing.assert_allclose(got["outputs"]["probabilities"], want["outputs"]["probabilities"],
                                       atol=ATOL)
            assert set(got["outputs"]) == {"label", "probabilities"}
        echoed = c.infer("tabular_py", rows()[0], params={"echo": 1})["outputs"]["echo"]
        assert echoed == rows()[0], "post(outputs, inputs) gets the request's own inputs"
        onnx = c.call({"op": "models"})["models"]["tabular_py"]["versions"]["1"]["onnx"]
    why = "user code runs only in the pools"
    assert onnx["postprocess"] == {"where": "pool", "us": 0, "why": why}
    assert (onnx["preprocess"]["where"], onnx["preprocess"]["why"]) == ("pool", why), onnx["preprocess"]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_hook_answers_as_the_builtin_chain_over_oip(srv, transport):
    mod = th if transport == "http" else tg
    client = (th.InferenceServerClient(srv.oip_http) if transport == "http"
              else tg.InferenceServerClient(srv.oip_grpc))
    inputs = tabular_inputs(mod, rows())
    want, got = client.infer("tabular", inputs), client.infer("tabular_py", inputs)
    assert [x.decode() for x in got.as_numpy("label")] == [x.decode() for x in want.as_numpy("label")]
    np.testing.assert_allclose(got.as_numpy("probabilities"), want.as_numpy("probabilities"), atol=ATOL)
    client.close()


def test_user_code_is_imported_only_in_the_postprocess_workers(srv, marks):
    with srv.client() as c:
        assert c.infer("tabular_py", rows()[0])["ok"]
    imported = {int(p.name) for p in marks.iterdir()}
    titles = {proc.pid: cmd for cmd, proc in srv.children().items()}
    assert imported and imported <= set(titles), (imported, titles)
    where = [titles[pid] for pid in imported]
    assert all(t.startswith("aieng::postprocess") for t in where), where
    assert srv.pid not in imported


def test_user_exceptions_map_to_codes_and_the_traceback_is_logged(srv):
    row = rows()[0]
    with srv.client() as c:
        bad = c.infer("tabular_py", row, params={"bad": "no such thing"}, raise_on_error=False)
        assert bad["error"]["code"] == "INVALID_INPUT"
        assert bad["error"]["message"] == "the hook refuses: no such thing"
        boom = c.infer("tabular_py", row, params={"boom": True}, raise_on_error=False)
        assert boom["error"]["code"] == "INTERNAL" and boom["error"]["message"] == "KeyError: 'boom'"
        assert c.infer("tabular_py", row)["ok"]
    logged = until(lambda: [r for r in srv.records() if 'raise KeyError("boom")' in r.get("msg", "")], 5)
    assert logged and logged[0]["level"] == "ERROR" and logged[0].get("trace"), "traceback and trace id"


class Streams:
    """Requests one after another to each of ``models`` on threads of their own, until stopped; every
    answer kept."""

    def __init__(self, srv, models: list[str]):
        self.srv, self.stop, self.answers = srv, threading.Event(), []
        self.threads = [threading.Thread(target=self.run, args=(m,), daemon=True) for m in models]

    def run(self, model: str) -> None:
        row = rows()[1]
        with Client(self.srv.addr, timeout_s=20) as c:
            while not self.stop.is_set():
                self.answers.append((model, c.infer(model, row, raise_on_error=False)))

    def __enter__(self) -> "Streams":
        for t in self.threads:
            t.start()
        until(lambda: len(self.answers) >= 4, 20)  # both streams are flowing before the fault
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads)


def test_a_crash_fails_only_its_own_request_and_the_worker_is_replaced(srv):
    row = rows()[0]
    restarts = lambda: sum(v for k, v in (srv.health() or {}).get("restarts", {}).items()  # noqa: E731
                           if k.startswith("post"))
    before = restarts()
    with Streams(srv, ["tabular_py", "tabular"]) as streams:
        with srv.client(timeout_s=30) as c:
            t0 = time.monotonic()
            crash = c.infer("tabular_py", row, params={"exit_after_s": 0.2}, raise_on_error=False)
        n_during = sum(1 for _ in streams.answers)
        assert crash["error"]["code"] == "UNAVAILABLE", crash
        assert "exited (code 3)" in crash["error"]["message"], crash
        assert time.monotonic() - t0 < 10
        until(lambda: len(streams.answers) >= n_during + 4, 20)  # and after it
    failed = [(m, a) for m, a in streams.answers if not a.get("ok")]
    assert failed == [], failed
    assert {m for m, _ in streams.answers} == {"tabular_py", "tabular"} and len(streams.answers) >= 8
    assert until(lambda: restarts() > before, 20), "the supervisor replaced the worker"
    with srv.client() as c:
        assert all(c.infer("tabular_py", r)["ok"] for r in rows())


def test_a_hang_fails_its_request_at_the_limit_and_the_others_are_answered(srv):
    row = rows()[0]
    with srv.client() as c:
        first = c.infer("tabular_py", row, params={"serial": True})
    with Streams(srv, ["tabular_py", "tabular"]) as streams:
        with srv.client(timeout_s=30) as c:
            t0 = time.monotonic()
            hung = c.infer("tabular_py", row, params={"spin": True}, raise_on_error=False)
            took = time.monotonic() - t0
        assert hung["error"]["code"] == "TIMEOUT", hung
        assert f"ran past its {LIMIT_MS} ms limit" in hung["error"]["message"], hung
        assert took < 3.0, took  # the step's limit, not the request's 5 s deadline
        n_during = len(streams.answers)
        until(lambda: len(streams.answers) >= n_during + 4, 20)
    failed = [(m, a) for m, a in streams.answers if not a.get("ok")]
    assert failed == [], failed
    # the instance the stopped call ran in is not used again: that worker built its second one.  Twelve sent
    # at once: each goes to the least loaded of the three workers, so every worker gets some (one at a time,
    # the round-robin turn, which other picks advance too, could send them all to one)
    async def together() -> set:
        client = AsyncClient(srv.addr, timeout_s=30)
        try:
            replies = await asyncio.gather(*(client.infer("tabular_py", row, params={"serial": 1})
                                             for _ in range(12)))
        finally:
            client.close()
        return {r["outputs"]["serial"] for r in replies}

    serials = asyncio.run(together())
    assert first["outputs"]["serial"] == 1 and 2 in serials, (first, serials)


def test_a_new_version_with_new_code_loads_at_run_time_beside_the_old(srv, repo):
    import subprocess
    import sys

    from aieng.client import build_request
    from tests.conftest import ROOT

    v2 = repo / "tabular_py" / "2"
    shutil.copytree(repo / "tabular_py" / "1", v2)
    (v2 / "post.py").write_text(POST_PY.replace('WHICH = "v1"', 'WHICH = "v2"'))
    argv = [sys.executable, "-m", "aieng.cli", "models", "load", "tabular_py", "2",
            "--admin-addr", srv.admin_addr]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)  # its golden set (the demo's) passed through the new code
    with srv.client() as c:
        for version, which in (("1", "v1"), ("2", "v2"), ("1", "v1")):
            reply = c.call(build_request("w", "tabular_py", rows()[0], params={"which": 1}, version=version))
            assert (reply["version"], reply["outputs"]["which"]) == (version, which)


def test_a_start_without_the_operators_consent_fails_with_one_line(repo, marks, make_server):
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), POSTHOOK_MARKS=str(marks))
    srv.start(wait=False)
    assert srv.proc.wait(60) != 0
    lines = [ln for ln in srv.output().splitlines() if "AIENG_ALLOW_MODEL_CODE" in ln]
    assert lines and "tabular_py" in lines[-1] and "post.py" in lines[-1], srv.output()
