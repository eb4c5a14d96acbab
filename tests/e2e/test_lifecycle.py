"""Start, die, restart, stop: with real processes and real signals.

Each test gets its own server (``make_server``), which checks on teardown
that no shared-memory segment of the instance is left.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from aieng import shm
from aieng.client import AsyncClient
from tests.conftest import MODELS, ROOT, ServerProcess

pytestmark = pytest.mark.e2e


def test_process_titles_and_sigterm_cleans_up(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="2", AIENG_POSTPROCESS_WORKERS="2").start()
    titles = sorted(cmd.split()[0] for cmd in srv.children() if cmd.startswith("aieng::"))
    assert titles == ["aieng::executor", "aieng::frontend", "aieng::postprocess[0]", "aieng::postprocess[1]",
                      "aieng::preprocess[0]", "aieng::preprocess[1]"]
    assert psutil.Process(srv.pid).cmdline()[0] == "aieng::supervisor"
    with srv.client() as c:
        assert c.infer("tabular", {"island": "Dream"})["ok"]
    assert len(srv.segments()) == 3  # two preprocess rings and the executor's
    kids = list(psutil.Process(srv.pid).children())
    assert srv.stop() == 0
    assert srv.segments() == []
    assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)
    assert not os.path.exists(f"/tmp/aieng.{srv.pid}")


def test_sigterm_drains_in_flight_requests(make_server):
    srv = make_server(AIENG_MODELS="minilm", AIENG_DRAIN_GRACE_S="20").start()
    texts = [" ".join(["drain"] * (20 + i)) for i in range(24)]

    async def load():
        client = AsyncClient(srv.addr, timeout_s=30)
        try:
            tasks = [asyncio.ensure_future(client.infer("minilm", {"text": t}, raise_on_error=False)) for t in texts]
            await asyncio.sleep(0.05)
            srv.proc.send_signal(signal.SIGTERM)  # stop while they are in flight
            return await asyncio.gather(*tasks)
        finally:
            client.close()

    replies = asyncio.run(load())
    assert len(replies) == len(texts)
    ok = sum(1 for r in replies if r["ok"])
    codes = {r["error"]["code"] for r in replies if not r["ok"]}
    assert codes <= {"UNAVAILABLE"}
    assert ok >= 1  # what was already in flight was finished, not dropped
    assert srv.proc.wait(30) == 0
    assert srv.segments() == []


@pytest.mark.parametrize("victim", ["aieng::preprocess[0]", "aieng::executor", "aieng::postprocess[0]",
                                    "aieng::frontend"])
def test_kill_9_a_worker_mid_load(make_server, victim):
    srv = make_server(AIENG_MODELS="minilm", AIENG_PREPROCESS_WORKERS="1").start()
    pid = srv.child_pid(victim)
    texts = [" ".join(["kill"] * (10 + i % 50)) for i in range(60)]

    async def load():
        client = AsyncClient(srv.addr, timeout_s=8)
        try:
            tasks = [asyncio.ensure_future(client.infer("minilm", {"text": t}, raise_on_error=False, timeout_ms=5000))
                     for t in texts]
            await asyncio.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
            return await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            client.close()

    t0 = time.monotonic()
    replies = asyncio.run(load())
    if victim == "aieng::frontend":
        # The frontend held the client connections: their requests are lost with it and clients
        # time out (bounded); the service itself must come back.
        assert all(isinstance(r, (dict, asyncio.TimeoutError)) for r in replies)
    else:
        assert all(isinstance(r, dict) for r in replies), "a client was left without an answer"
        codes = {r["error"]["code"] for r in replies if not r["ok"]}
        assert codes <= {"UNAVAILABLE", "TIMEOUT"}, codes
    h = srv.wait_ready(timeout=30)
    recovered = time.monotonic() - t0
    assert h["restarts"][h["processes"][{"aieng::preprocess[0]": "pre-0", "aieng::executor": "executor",
                                          "aieng::postprocess[0]": "post-0", "aieng::frontend": "frontend"}[victim]]
                          ["role"]] == 1
    assert srv.child_pid(victim) != pid
    with srv.client() as c:
        assert c.infer("minilm", {"text": "alive again"})["ok"]
    # the dead process's ring is gone; only live rings remain (one preprocess + the executor)
    assert len(srv.segments()) == 2, srv.segments()
    print(f"{victim}: ready again {recovered:.2f}s after the kill")


def test_startup_failure_names_role_and_exit_code(tmp_path):
    repo = tmp_path / "models"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    (repo / "broken" / "1" / "model.yaml").write_text(
        "inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
        "preprocess: {type: tensor}\npostprocess: {type: tensor}\n")
    srv = ServerProcess(tmp_path, AIENG_MODEL_REPOSITORY=str(repo))
    srv.start(wait=False)
    code = srv.proc.wait(60)
    out = srv.output()
    assert code != 0
    assert "executor" in out and "failed to start" in out and "exit code 1" in out, out
    assert shm.list_segments(str(srv.pid)) == []


def test_supervisor_kill_9_children_exit_and_next_start_cleans(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    kids = list(psutil.Process(srv.pid).children())
    assert srv.segments()
    old = srv.pid
    srv.proc.kill()
    srv.proc.wait(10)
    gone, alive = psutil.wait_procs(kids, timeout=15)
    assert not alive, f"orphans: {[k.pid for k in alive]}"
    # the children may leave their rings behind; the next instance removes them
    left = shm.list_segments(str(old))
    nxt = make_server(AIENG_MODELS="tabular").start()
    assert shm.list_segments(str(old)) == []
    if left:
        assert "stale" in nxt.output()


def test_config_error_names_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env["AIENG_PREPROCESS_WORKERS"] = "many"
    r = subprocess.run([sys.executable, "-m", "aieng.cli", "serve"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "AIENG_PREPROCESS_WORKERS" in r.stderr


def test_hung_executor_is_detected_and_replaced(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_HANG_TIMEOUT_S="3").start()
    pid = srv.child_pid("aieng::executor")
    os.kill(pid, signal.SIGSTOP)  # alive to the OS, silent to everyone: a model run that never returns
    t0 = time.monotonic()
    with srv.client(timeout_s=30) as c:
        reply = c.infer("tabular", {"island": "Dream"}, raise_on_error=False, timeout_ms=20000)
    assert reply["ok"] is False and reply["error"]["code"] == "UNAVAILABLE", reply
    import urllib.error
    import urllib.request

    try:  # while it is down (or still loading), readiness is not green
        code = urllib.request.urlopen(srv.http + "/readyz", timeout=5).status
    except urllib.error.HTTPError as e:
        code = e.code
    assert code == 503 or srv.health()["restarts"]["executor"] == 1
    assert psutil.pid_exists(pid) is False or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    srv.wait_ready(30)
    print(f"hung executor replaced, ready {time.monotonic() - t0:.1f}s after it stopped")
    with srv.client() as c:
        assert c.infer("tabular", {"island": "Dream"})["ok"]
    assert "hung" in srv.output()


def test_a_worker_that_keeps_dying_backs_off(make_server):
    import json
    import re

    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="2").start()
    for _ in range(3):
        pid = srv.child_pid("aieng::preprocess[1]")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if srv.child_pid("aieng::preprocess[1]") != pid:
                    break
            except KeyError:
                pass
            time.sleep(0.05)
        with srv.client() as c:  # the other preprocess worker keeps the service up meanwhile
            assert c.infer("tabular", {"island": "Dream"})["ok"]
    delays = []
    for line in srv.output().splitlines():
        try:
            msg = json.loads(line)["msg"]
        except (ValueError, KeyError):
            continue
        hit = re.match(r"pre-1 \(pid \d+\) died .* restart in ([0-9.]+)s", msg)
        if hit:
            delays.append(float(hit.group(1)))
    assert delays == [0.1, 0.2, 0.4], delays  # quick deaths double the wait
    h = srv.wait_ready(20)
    assert h["restarts"]["preprocess"] == 3 and h["processes"]["pre-1"]["restarts"] == 3
