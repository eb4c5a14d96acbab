"""Postprocess chains with per-step time limits, against the real server (issue 13, rule chains).

A tiny identity model ``x -> y`` is served twice with the chain softmax -> ``slow_py`` (a pure-Python
busy loop) -> ``slow_c`` (one long OpenCV call that releases the GIL), each step limited to 300 ms:
``chain_skip`` skips a step past its limit, ``chain_fail`` fails the request naming it.  The slow ops
are test-only (tests/e2e/slow_ops.py), registered in every server process through a
``sitecustomize`` on the server's PYTHONPATH; a request's params say how slow they are.

Each case: the answer (or the error) arrives within the request's deadline, long before the slow
step would have ended on its own; the next request is answered in full by the same postprocess
worker (same pid); and ``timing_us`` and the timing report show the steps and their outcomes.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from aieng.client import ServerError
from aieng.tools.report import fetch, render
from aieng.wire.protocol import TIMEOUT
from tests.conftest import ROOT, ServerProcess, save_tensor_model

pytestmark = pytest.mark.e2e

LIMIT_MS = 300
# The request's own deadline: a step left running would make the frontend answer "no answer within
# the deadline" instead of what the step's policy says, so each test's content shows the step stopped.
DEADLINE_MS = 2000
SPIN = {"spin_s": 30.0}  # far past the limit and the deadline
BLUR = {"blur_sigma": 100.0}  # a 2000 x 2000 blur: one OpenCV call of several seconds (3.3 s at 60 here)
X = np.array([[1.0, 2.0, 3.0]], np.float32)


def chain_model(repo, name: str, on_timeout: str) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1, 3])])
    save_tensor_model(repo, name, graph)
    yaml = repo / name / "1" / "model.yaml"
    text = yaml.read_text().replace(
        "postprocess: {type: tensor}\n",
        "postprocess:\n"
        "  steps:\n"
        "    - {op: softmax, source: y, output: probs}\n"
        f"    - {{op: test_spin, name: slow_py, source: probs, output: spun, timeout_ms: {LIMIT_MS},"
        f" on_timeout: {on_timeout}}}\n"
        f"    - {{op: test_blur, name: slow_c, source: probs, output: blurred, timeout_ms: {LIMIT_MS},"
        f" on_timeout: {on_timeout}}}\n")
    yaml.write_text(text)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chain")
    repo = tmp / "repo"
    repo.mkdir()
    chain_model(repo, "chain_skip", "skip")
    chain_model(repo, "chain_fail", "fail")
    plugin = tmp / "plugin"
    plugin.mkdir()
    (plugin / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {ROOT!r})\nimport tests.e2e.slow_ops  # noqa: F401\n")
    server = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(repo), AIENG_POSTPROCESS_WORKERS="1",
                           PYTHONPATH=str(plugin)).start()
    yield server
    assert server.stop() == 0, server.output()
    assert server.segments() == [], "shared memory left behind after a clean stop"


def timed(c, model: str, params: dict, raise_on_error: bool = True) -> tuple[dict, float]:
    t0 = time.monotonic()
    reply = c.infer(model, {"x": X}, params=params, timeout_ms=DEADLINE_MS, raise_on_error=raise_on_error)
    return reply, time.monotonic() - t0


def full_answer(c, model: str) -> dict:
    reply, _ = timed(c, model, {})
    assert set(reply["outputs"]) == {"probs", "spun", "blurred"}
    assert "skipped_steps" not in reply and "degraded" not in reply
    return reply


@pytest.mark.parametrize("params,step", [(SPIN, "slow_py"), (BLUR, "slow_c")], ids=["python-loop", "c-call"])
def test_skip_answers_without_the_step_marked_degraded(srv, params, step):
    pid = srv.child_pid("aieng::postprocess[0]")
    with srv.client(timeout_s=30) as c:
        reply, wall = timed(c, "chain_skip", params)
        assert wall < DEADLINE_MS / 1000
        assert reply["skipped_steps"] == [step] and reply["degraded"] == 1
        kept = {"probs", "spun", "blurred"} - {"spun" if step == "slow_py" else "blurred"}
        assert set(reply["outputs"]) == kept
        e = np.exp(X[0] - X[0].max())
        np.testing.assert_allclose(reply["outputs"]["probs"][0], e / e.sum(), rtol=1e-6)
        assert reply["timing_us"][f"postprocess.{step}"] >= LIMIT_MS * 1000
        assert reply["timing_us"]["postprocess"] >= reply["timing_us"][f"postprocess.{step}"]
        full = full_answer(c, "chain_skip")  # the worker goes on serving
        assert set(full["timing_us"]) >= {"postprocess.softmax", "postprocess.slow_py", "postprocess.slow_c"}
    assert srv.child_pid("aieng::postprocess[0]") == pid


@pytest.mark.parametrize("params,step,op", [(SPIN, "slow_py", "test_spin"), (BLUR, "slow_c", "test_blur")],
                         ids=["python-loop", "c-call"])
def test_fail_answers_timeout_naming_the_step(srv, params, step, op):
    pid = srv.child_pid("aieng::postprocess[0]")
    with srv.client(timeout_s=30) as c:
        reply, wall = timed(c, "chain_fail", params, raise_on_error=False)
        assert wall < DEADLINE_MS / 1000
        assert reply["ok"] is False
        assert reply["error"] == {"code": TIMEOUT, "message": f"postprocess step '{step}' (op {op}) ran past "
                                                              f"its {LIMIT_MS} ms limit"}
        full_answer(c, "chain_fail")
    assert srv.child_pid("aieng::postprocess[0]") == pid


def test_report_shows_each_step_and_its_timeouts(srv):
    fetch(srv.addr, reset=True, admin_addr=srv.admin_addr)
    with srv.client(timeout_s=30) as c:
        full_answer(c, "chain_skip")
        timed(c, "chain_skip", SPIN)
        with pytest.raises(ServerError) as err:
            timed(c, "chain_fail", SPIN)
        assert err.value.code == TIMEOUT
    stats = fetch(srv.addr)
    skip = stats["models"]["chain_skip"]["steps_us"]
    assert {k: (v["runs"], v["skipped"], v["timeout"]) for k, v in skip.items()} == {
        "softmax": (2, 0, 0), "slow_py": (2, 1, 0), "slow_c": (2, 0, 0)}
    assert skip["slow_py"]["mean"] >= LIMIT_MS * 1000 / 2  # of two runs, one ran to the limit
    fail = stats["models"]["chain_fail"]
    assert fail["requests"] == 0  # no answer in this window, but its steps are shown
    assert {k: (v["runs"], v["timeout"]) for k, v in fail["steps_us"].items()} == {
        "softmax": (1, 0), "slow_py": (1, 1)}
    text = render(stats)
    assert "| slow_py | 2 |" in text and "| slow_py | 1 |" in text
    assert "## chain_fail: no answered requests" in text


def test_an_unknown_op_fails_the_start_naming_the_step(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    chain_model(repo, "chain_skip", "skip")  # its test ops are not registered: no plugin here
    server = ServerProcess(tmp_path, AIENG_MODEL_REPOSITORY=str(repo))
    server.start(wait=False)
    try:
        code = server.proc.wait(60)
    finally:
        server.stop()
    assert code != 0
    assert "postprocess step 2 'slow_py': unknown op 'test_spin'" in server.output()
