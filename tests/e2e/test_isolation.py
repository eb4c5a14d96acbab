"""One model file, one instance, one setting takes down no more than itself (issue 9, findings
4 and 5 and the runtime-dir item), against the real server.

- A model broken on disk while serving, then kill -9 of the executor: the restarted executor
  refuses the changed model (UNAVAILABLE naming it) and serves the others; it does not crash-loop.
- A corrupt model at start: strict (default) exits non-zero with one error line naming the model
  and its path; with AIENG_STRICT_MODEL_LOAD=false the others serve and it is UNAVAILABLE.
- A second instance on the same AIENG_RUNTIME_DIR is refused at once naming the directory and the
  first's pid; the first keeps serving.
- An uncreatable AIENG_RUNTIME_DIR is a configuration error naming the variable, not a traceback.

Each test works on its own copy of the demo models it calls (the fixture's make_server checks /dev/shm).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time

import numpy as np
import pytest

from tests.conftest import MODELS

pytestmark = pytest.mark.e2e

TABULAR = {"island": "Dream"}
GARBAGE = b"\x08\x07not an onnx model\xff" * 4096
START_TIMEOUT_S = 120.0
SERVED = ("minilm", "tabular", "orientation")  # the models these tests call: one text, one tabular, one image


def copy_repo(tmp_path) -> str:
    """The demo models the tests call, copied: not the OCR ones, whose loads (again at each executor
    restart) would only make the start slow."""
    repo = tmp_path / "models"
    for name in SERVED:  # real files: breaking them never touches models/
        shutil.copytree(os.path.join(MODELS, name), repo / name, symlinks=False)
    return str(repo)


def tabular_repo(tmp_path) -> str:
    repo = tmp_path / "tabular-only"
    shutil.copytree(os.path.join(MODELS, "tabular"), repo / "tabular", symlinks=False)
    return str(repo)


def onnx_path(repo: str, name: str) -> str:
    return os.path.realpath(os.path.join(repo, name, "1", "model.onnx"))


def png() -> bytes:
    import cv2

    img = np.random.default_rng(5).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    return cv2.imencode(".png", img)[1].tobytes()


def supervisor_errors(output: str) -> list[str]:
    lines = []
    for line in output.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("role") == "supervisor" and rec.get("level") == "ERROR":
            lines.append(rec["msg"])
    return lines


def wait_exit(srv, timeout: float) -> int:
    try:
        return srv.proc.wait(timeout)
    except Exception:
        raise AssertionError(f"server still running after {timeout}s:\n{srv.output()}") from None


def test_model_broken_on_disk_then_executor_killed(make_server, tmp_path):
    repo = copy_repo(tmp_path)
    srv = make_server(AIENG_MODEL_REPOSITORY=repo).start(timeout=START_TIMEOUT_S)
    with srv.client(timeout_s=10) as c:
        assert c.infer("minilm", {"text": "before"})["ok"]
        assert c.infer("tabular", TABULAR)["ok"]
        with open(onnx_path(repo, "minilm"), "wb") as fh:  # overwritten in place while serving
            fh.write(GARBAGE)
        os.kill(srv.child_pid("aieng::executor"), signal.SIGKILL)
        t0 = time.monotonic()
        recovered = None
        for _ in range(300):  # bounded: at most 30 s of polling
            if time.monotonic() - t0 > 30:
                break
            if c.infer("tabular", TABULAR, raise_on_error=False)["ok"]:
                recovered = time.monotonic() - t0
                break
            time.sleep(0.1)
        assert recovered is not None, f"tabular not serving 30 s after the kill:\n{srv.output()[-4000:]}"
        print(f"tabular served again {recovered:.2f}s after the executor kill")

        r = c.infer("minilm", {"text": "after"}, raise_on_error=False)
        assert r["error"]["code"] == "UNAVAILABLE", r
        assert "model minilm:1" in r["error"]["message"]
        assert "content changed on disk since start" in r["error"]["message"]
        restarts = c.health()["restarts"]["executor"]
        assert restarts == 1
        t1 = time.monotonic()
        answered = 0
        # keeps serving, for longer than a crash loop's back-off
        while time.monotonic() - t1 < 5 and answered < 500:
            assert c.infer("tabular", TABULAR)["ok"]
            answered += 1
        assert c.infer("orientation", {"image": png()})["ok"]
        h = c.health()
        assert h["restarts"]["executor"] == 1, "the executor is crash-looping"
        assert h["processes"]["executor"]["alive"] and h["ready"]
    assert srv.stop() == 0


def test_corrupt_model_at_start_strict_fails_naming_it(make_server, tmp_path):
    repo = copy_repo(tmp_path)
    with open(onnx_path(repo, "minilm"), "wb") as fh:
        fh.write(GARBAGE)
    srv = make_server(AIENG_MODEL_REPOSITORY=repo).start(wait=False)
    code = wait_exit(srv, START_TIMEOUT_S)
    out = srv.output()
    assert code != 0, out
    errors = [e for e in supervisor_errors(out) if e.startswith("startup failed")]
    assert len(errors) == 1, out
    assert "model minilm:1" in errors[0] and onnx_path(repo, "minilm") in errors[0], errors[0]


def test_corrupt_model_at_start_not_strict_serves_the_others(make_server, tmp_path):
    repo = copy_repo(tmp_path)
    with open(onnx_path(repo, "minilm"), "wb") as fh:
        fh.write(GARBAGE)
    srv = make_server(AIENG_MODEL_REPOSITORY=repo,
                      AIENG_STRICT_MODEL_LOAD="false").start(timeout=START_TIMEOUT_S)
    with srv.client(timeout_s=10) as c:
        assert c.infer("tabular", TABULAR)["ok"]
        assert c.infer("orientation", {"image": png()})["ok"]
        r = c.infer("minilm", {"text": "hello"}, raise_on_error=False)
        assert r["error"]["code"] == "UNAVAILABLE", r
        assert f"model minilm:1 ({onnx_path(repo, 'minilm')})" in r["error"]["message"]
        assert c.health()["restarts"]["executor"] == 0
    assert srv.stop() == 0


def test_second_instance_on_the_same_runtime_dir_is_refused(make_server, tmp_path):
    rdir = tmp_path / "rt"
    repo = tabular_repo(tmp_path)
    first = make_server(AIENG_RUNTIME_DIR=str(rdir),
                        AIENG_MODEL_REPOSITORY=repo).start(timeout=START_TIMEOUT_S)
    second = make_server(AIENG_RUNTIME_DIR=str(rdir), AIENG_MODEL_REPOSITORY=repo).start(wait=False)
    code = wait_exit(second, 30)
    out = second.output()
    assert code != 0, out
    errors = supervisor_errors(out)
    assert len(errors) == 1, out
    assert str(rdir) in errors[0] and f"pid {first.pid}" in errors[0], errors[0]
    assert (rdir / "hub.sock").exists(), "the refused instance removed the first one's socket"
    with first.client(timeout_s=10) as c:
        assert c.infer("tabular", TABULAR)["ok"]
        h = c.health()
        assert h["ready"] and sum(h["restarts"].values()) == 0
    assert first.stop() == 0
    assert not (rdir / "aieng.lock").exists() and not (rdir / "hub.sock").exists()


@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_uncreatable_runtime_dir_is_a_configuration_error(make_server, tmp_path, where):
    if where == "under_a_file":
        (tmp_path / "plain").write_text("not a directory")
        rdir = str(tmp_path / "plain" / "rt")
    else:
        rdir = "/proc/aieng-no-such-dir"
    srv = make_server(AIENG_RUNTIME_DIR=rdir, AIENG_MODEL_REPOSITORY=tabular_repo(tmp_path)).start(wait=False)
    code = wait_exit(srv, 30)
    out = srv.output()
    assert code == 2, out
    assert "Traceback" not in out
    errors = supervisor_errors(out)
    assert len(errors) == 1 and "AIENG_RUNTIME_DIR" in errors[0] and rdir in errors[0], out
