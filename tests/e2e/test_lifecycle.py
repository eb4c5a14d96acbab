"""Start, die, restart, stop: with real processes and real signals.

Each test gets its own server (``make_server``), which checks on teardown
that no shared-memory segment of the instance is left.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import msgpack
import psutil
import pytest
import zmq

from aieng.wire import shm
from tests.conftest import ROOT, ServerProcess
from tests.waits import until

pytestmark = pytest.mark.e2e


class Dealer:
    """One DEALER socket that sends requests with unique ids and counts the answers per id."""

    def __init__(self, addr: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(addr)
        self.replies: dict = {}  # id -> every answer received for it

    def send_infer(self, prefix: str, model: str, inputs: list[dict], timeout_ms: int) -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(len(inputs))]
        for rid, inp in zip(ids, inputs):
            req = {"id": rid, "model": model, "inputs": inp, "timeout_ms": timeout_ms}
            self.sock.send(msgpack.packb(req))
        return ids

    def receive(self, timeout_s: float) -> bool:
        if not self.sock.poll(int(timeout_s * 1000)):
            return False
        reply = msgpack.unpackb(self.sock.recv(), raw=False)
        self.replies.setdefault(reply.get("id"), []).append(reply)
        return True

    def collect(self, ids: list, timeout_s: float) -> None:
        """Receive until every id in ``ids`` has an answer, or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while any(i not in self.replies for i in ids) and self.receive(max(0.0, deadline - time.monotonic())):
            pass

    def barrier(self, tag: str) -> dict:
        """A health op sent after everything else on this connection: the frontend reads one
        connection's messages in order, so its answer means every earlier request was admitted."""
        self.sock.send(msgpack.packb({"op": "health", "id": tag}))
        self.collect([tag], 20)
        (h,) = self.replies.pop(tag)
        return h

    def one_answer_each(self, ids: list, quiet_s: float = 0.5) -> dict:
        """The answer to each id; fails on a missing, duplicate or unexpected answer (a late one
        has ``quiet_s`` of silence to show up in)."""
        while self.receive(quiet_s):
            pass
        unanswered, unexpected = set(ids) - set(self.replies), set(self.replies) - set(ids)
        assert not unanswered and not unexpected, f"unanswered: {unanswered}, unexpected: {unexpected}"
        twice = {i: len(r) for i, r in self.replies.items() if len(r) != 1}
        assert not twice, f"answered more than once: {twice}"
        return {i: r[0] for i, r in self.replies.items()}

    def close(self) -> None:
        self.sock.close(0)


def wait_for_log(srv: ServerProcess, prefix: str, timeout_s: float) -> str:
    """The first log message starting with ``prefix`` (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in srv.output().splitlines():
            try:
                msg = json.loads(line)["msg"]
            except (ValueError, KeyError, TypeError):
                continue
            if msg.startswith(prefix):
                return msg
        time.sleep(0.05)
    raise AssertionError(f"no log line {prefix!r} within {timeout_s}s:\n{srv.output()[-3000:]}")


def test_process_titles_and_sigterm_cleans_up(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="2",
                      AIENG_POSTPROCESS_WORKERS="2").start()
    titles = sorted(cmd.split()[0] for cmd in srv.children() if cmd.startswith("aieng::"))
    assert titles == ["aieng::executor", "aieng::frontend", "aieng::gateway[0]", "aieng::postprocess[0]",
                      "aieng::postprocess[1]", "aieng::preprocess[0]", "aieng::preprocess[1]"]
    assert psutil.Process(srv.pid).cmdline()[0] == "aieng::supervisor"
    with srv.client() as c:
        assert c.infer("tabular", {"island": "Dream"})["ok"]
    assert len(srv.segments()) == 3  # two preprocess rings and the executor's
    kids = list(psutil.Process(srv.pid).children(recursive=True))
    assert srv.stop() == 0
    assert srv.segments() == []
    assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)
    assert not os.path.exists(f"/tmp/aieng.{srv.pid}")


def test_sigterm_drains_in_flight_requests(make_server):
    srv = make_server(AIENG_MODELS="minilm", AIENG_DRAIN_GRACE_S="20").start()
    inputs = [{"text": " ".join(["drain"] * (20 + i))} for i in range(24)]
    executor = srv.child_pid("aieng::executor")
    d = Dealer(srv.addr)
    try:
        # Hold every request at the executor until the drain has begun, so all of them are in
        # flight when SIGTERM arrives, whatever the machine's speed.
        os.kill(executor, signal.SIGSTOP)
        try:
            ids = d.send_infer("drain", "minilm", inputs, timeout_ms=25000)
            assert d.barrier("admitted")["in_flight"] == len(ids)
            srv.proc.send_signal(signal.SIGTERM)
            assert wait_for_log(srv, "draining:", 15).startswith(f"draining: {len(ids)} in flight")
        finally:
            os.kill(executor, signal.SIGCONT)
        d.collect(ids, 30)
        replies = d.one_answer_each(ids)
    finally:
        d.close()
    failed = {i: r["error"] for i, r in replies.items() if not r["ok"]}
    assert not failed, failed  # drained: every request in flight at SIGTERM was finished, none dropped
    assert srv.proc.wait(30) == 0
    assert srv.segments() == []


VICTIMS = {"aieng::preprocess[0]": "pre-0", "aieng::executor": "executor", "aieng::postprocess[0]": "post-0",
           "aieng::frontend": "frontend"}


@pytest.mark.parametrize("victim", list(VICTIMS))
def test_kill_9_a_worker_mid_load(make_server, victim):
    srv = make_server(AIENG_MODELS="minilm", AIENG_PREPROCESS_WORKERS="1").start()
    pid = srv.child_pid(victim)
    inputs = [{"text": " ".join(["kill"] * (10 + i % 50))} for i in range(60)]
    t0 = time.monotonic()
    d = Dealer(srv.addr)
    try:
        if victim == "aieng::frontend":
            kill_frontend_holding_requests(srv, d, pid, inputs)
        else:
            ids = d.send_infer("kill", "minilm", inputs, timeout_ms=5000)
            d.barrier("admitted")  # every request admitted: the kill lands mid-load
            os.kill(pid, signal.SIGKILL)
            d.collect(ids, 20)
            replies = d.one_answer_each(ids)  # a dead worker's requests are answered, each once
            codes = {r["error"]["code"] for r in replies.values() if not r["ok"]}
            assert codes <= {"UNAVAILABLE", "TIMEOUT"}, codes
    finally:
        d.close()
    h = srv.wait_ready(timeout=30)
    recovered = time.monotonic() - t0
    assert h["restarts"][h["processes"][VICTIMS[victim]]["role"]] == 1
    assert srv.child_pid(victim) != pid
    with srv.client() as c:
        assert c.infer("minilm", {"text": "alive again"})["ok"]
    # the dead process's ring is gone; only live rings remain (one preprocess + the executor)
    assert len(srv.segments()) == 2, srv.segments()
    print(f"{victim}: ready again {recovered:.2f}s after the kill")


def kill_frontend_holding_requests(srv: ServerProcess, d: Dealer, pid: int, inputs: list[dict]) -> None:
    """The frontend holds the client connections and the request table: what it admitted is
    lost with it, and no process answers those requests later (the restarted frontend starts
    a new table and drops what it hears about its predecessor's requests).  Clients time out."""
    executor = srv.child_pid("aieng::executor")
    os.kill(executor, signal.SIGSTOP)  # nothing can be answered before the kill
    try:
        ids = d.send_infer("kill", "minilm", inputs, timeout_ms=5000)
        assert d.barrier("admitted")["in_flight"] == len(ids)
        os.kill(pid, signal.SIGKILL)
    finally:
        os.kill(executor, signal.SIGCONT)  # it finishes the lost requests for nobody
    srv.wait_ready(timeout=30)
    # the same socket reconnects to the new frontend and is served; none of the old ids is answered
    d.sock.send(msgpack.packb({"id": "after", "model": "minilm", "inputs": {"text": "after the kill"}}))
    d.collect(["after"], 20)
    # the executor's late results for the old ids reach the new frontend around the time it serves
    # "after" (the executor was let go before the new frontend was ready): a wrong answer made
    # from them would show up here
    assert d.one_answer_each(["after"], quiet_s=1.0)["after"]["ok"]


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


def fork_server(srv: ServerProcess) -> psutil.Process:
    [fork] = [p for p in psutil.Process(srv.pid).children()
              if "multiprocessing.forkserver" in " ".join(p.cmdline())]
    return fork


def workers(srv: ServerProcess) -> dict[str, psutil.Process]:
    return {cmd.split()[0]: p for cmd, p in srv.children().items() if cmd.startswith("aieng::")}


def served(srv: ServerProcess) -> bool:
    try:
        with srv.client(timeout_s=2) as c:
            return c.infer("tabular", {"island": "Dream"}, raise_on_error=False)["ok"]
    except Exception:  # the frontend is restarting: not yet
        return False


def test_children_fork_from_a_fork_server_that_a_group_signal_does_not_kill(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    fork, kids = fork_server(srv), workers(srv)
    assert {"aieng::frontend", "aieng::executor", "aieng::preprocess[0]", "aieng::postprocess[0]"} <= set(
        kids)
    assert {p.ppid() for p in kids.values()} == {fork.pid}
    os.kill(fork.pid, signal.SIGTERM)  # what a group-wide SIGTERM or a terminal's hang-up gives it
    os.kill(fork.pid, signal.SIGHUP)
    with open(f"/proc/{fork.pid}/status", encoding="ascii") as fh:
        status = dict(line.split(":\t", 1) for line in fh.read().splitlines() if ":\t" in line)
    pending = int(status["ShdPnd"], 16)
    assert pending & (1 << (signal.SIGTERM - 1)) and pending & (1 << (signal.SIGHUP - 1)), status["ShdPnd"]
    assert served(srv)
    assert fork.is_running()
    assert {t: p.pid for t, p in workers(srv).items()} == {t: p.pid for t, p in kids.items()}


def test_a_killed_fork_server_restarts_every_child_and_the_service_comes_back(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    fork, before = fork_server(srv), workers(srv)
    old_pids = {p.pid for p in before.values()}
    os.kill(fork.pid, signal.SIGKILL)

    def replaced() -> bool:  # the old children may still answer for a moment before their SIGTERM lands
        now = workers(srv)
        return set(now) == set(before) and not {p.pid for p in now.values()} & old_pids

    assert until(replaced, 60, 0.2), {t: p.pid for t, p in workers(srv).items()}
    assert until(lambda: served(srv), 60, 0.2)
    gone, alive = psutil.wait_procs(list(before.values()), timeout=15)  # the old ones got their SIGTERM
    assert alive == [], [p.pid for p in alive]


def test_supervisor_kill_9_children_exit_and_next_start_cleans(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    kids = list(psutil.Process(srv.pid).children(recursive=True))
    assert srv.segments()
    old = srv.pid
    srv.proc.kill()
    srv.proc.wait(10)
    gone, alive = psutil.wait_procs(kids, timeout=15)
    assert not alive, f"orphans: {[k.pid for k in alive]}"
    # A crashed instance's ring (as a worker killed with -9 leaves it): the next instance removes it. Any
    # server that starts on this machine cleans every dead instance's segments, and the other test worker's
    # may start in the moment between this one's segment and this server: then try again (bounded).
    name, cleaned = shm.segment_name(str(old), "pre-0", os.getpid()), []
    try:
        for _ in range(3):
            shm.Segment(name, 4096, create=True).close()
            assert name in shm.list_segments(str(old))
            nxt = make_server(AIENG_MODELS="tabular").start()
            assert shm.list_segments(str(old)) == []
            cleaned = [line for line in nxt.output().splitlines() if "stale" in line and name in line]
            if cleaned:
                break
            nxt.stop()
        assert cleaned, "no start of ours removed the crashed instance's segment in 3 tries"
    finally:
        shm.unlink_prefix(f"{shm.PREFIX}{old}.")  # whatever happened, leave nothing in /dev/shm


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
    assert reply["error"]["message"].startswith("executor exited"), reply  # answered by the death
    # The supervisor reaps the killed executor before it reports the death that answered us, and
    # its replacement says hello only after a 0.1 s back-off, a fresh interpreter and a model load:
    # until then the frontend has no executor and readiness is red (the health op is answered by the
    # frontend's one thread, so after it the HTTP snapshot reflects the death too).
    assert not psutil.pid_exists(pid)
    h = srv.health()
    assert h is not None and h["ready"] is False and h["workers"]["executor"] == 0, h
    try:
        code = urllib.request.urlopen(srv.http + "/readyz", timeout=5).status
    except urllib.error.HTTPError as e:
        code = e.code
    assert code == 503
    h = srv.wait_ready(30)
    assert h["restarts"]["executor"] == 1
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
