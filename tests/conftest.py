"""Shared test fixtures: a real aieng server as a subprocess on loopback.

``ServerProcess`` starts ``python -m aieng.cli serve`` with its own port and
environment, waits for the ``health`` op to say ready (bounded), and on stop
sends SIGTERM and checks that nothing of its instance is left in /dev/shm.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil
import pytest

from aieng.client import Client
from aieng.wire import shm
from tests.waits import until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on now and that this test process has not handed out before.

    The kernel may give the same ephemeral port to two consecutive binds once the first socket is closed, so
    a server's four ports could collide (seen in CI: the frontend and the OIP HTTP door on one port).  Under
    pytest-xdist each worker takes only its share of the ports (by ``port // 2``: Linux hands out even ports
    to ``bind``), so two workers never hand out the same one."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0) % count
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if (port // 2) % count == index and port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def exited(proc: psutil.Process) -> bool:
    """The process has exited: it is gone, or a zombie nobody has reaped yet (it holds nothing then)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class ServerProcess:
    def __init__(self, tmp_path, **env: str):
        self.port = free_port()
        self.addr = f"tcp://127.0.0.1:{self.port}"
        self.log_path = os.path.join(str(tmp_path), f"server-{self.port}.log")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
        self.http_port = free_port()
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.oip_http_port, self.oip_grpc_port = free_port(), free_port()  # the OIP gateway's, per server
        self.oip_http = f"127.0.0.1:{self.oip_http_port}"
        self.oip_grpc = f"127.0.0.1:{self.oip_grpc_port}"
        self.env.update({"AIENG_FRONTEND_ADDR": self.addr, "AIENG_MODEL_REPOSITORY": MODELS,
                         "AIENG_LOG_LEVEL": "INFO", "AIENG_HTTP_ADDR": f"127.0.0.1:{self.http_port}",
                         "AIENG_OIP_HTTP_ADDR": self.oip_http, "AIENG_OIP_GRPC_ADDR": self.oip_grpc,
                         # routing state of this test's own, not the user's ~/.local/state/aieng that every
                         # other run on the machine (and a parallel test worker) reads and writes
                         "AIENG_STATE_DIR": os.path.join(str(tmp_path), "state"),
                         # a start-up warm-up of batches up to 4 rows: minilm's 32-row runs were half of every
                         # server start, and its 8-row ones still 2.0 of its 3.6 s of warm-up on one thread
                         # (a test that needs more sets its own)
                         "AIENG_WARMUP_MAX_ROWS": "4"})
        self.env.update(env)
        self.proc: subprocess.Popen | None = None
        self.prefix: list[str] = []  # a command the server runs under (e.g. prlimit), set before start
        self.args: list[str] = []  # arguments after `serve` (e.g. a ServingRuntime's), set before start
        self.curve: tuple | None = None  # (client public, client secret, server public) when CURVE is on

    def start(self, wait: bool = True, timeout: float = 90.0) -> "ServerProcess":
        self.log = open(self.log_path, "wb")
        argv = self.prefix + [sys.executable, "-m", "aieng.cli", "serve", *self.args]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def admin_addr(self) -> str:
        """The admin socket: in AIENG_RUNTIME_DIR when set, else in the supervisor's ``<tmp>/aieng.<pid>``."""
        rdir = self.env.get("AIENG_RUNTIME_DIR") or os.path.join(tempfile.gettempdir(), f"aieng.{self.pid}")
        return self.env.get("AIENG_ADMIN_ADDR") or f"ipc://{rdir}/admin.sock"

    def client(self, **kw) -> Client:
        return Client(self.addr, **kw)

    def health(self, timeout_s: float = 2.0) -> dict | None:
        with Client(self.addr, timeout_s=timeout_s, dealer=True, curve=self.curve) as c:
            try:
                return c.health()
            except (TimeoutError, Exception):
                return None

    def wait_ready(self, timeout: float = 90.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            h = self.health(timeout_s=1.0)
            if h and h.get("ready"):
                return h
            time.sleep(0.05)  # the poll's step: a starting server's CPUs go to its start, not to health ops
        raise RuntimeError(f"server not ready within {timeout}s:\n{self.output()}")

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as fh:
            return fh.read().decode(errors="replace")

    def records(self) -> list[dict]:
        """The server's JSON log lines so far (``AIENG_LOG_FORMAT=json``), as maps; a line that is not JSON
        (a native library's own stderr) is skipped."""
        out = []
        for raw in self.output().splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                pass
        return out

    def children(self) -> dict[str, psutil.Process]:
        out = {}
        for c in psutil.Process(self.pid).children(recursive=True):
            try:
                out[" ".join(c.cmdline())] = c
            except psutil.NoSuchProcess:
                pass
        return out

    def child_pid(self, title: str) -> int:
        for cmd, proc in self.children().items():
            if cmd.startswith(title):
                return proc.pid
        raise KeyError(f"no child titled {title!r} in {list(self.children())}")

    def worker_counts(self, role: str, n: int) -> dict:
        """``aieng_worker_requests_total`` of ``role`` per worker from /metrics, once they add up to ``n``
        (it is rendered at most every AIENG_SNAPSHOT_MS: a bounded wait; the last reading after 5 s)."""
        from prometheus_client.parser import text_string_to_metric_families

        def read() -> dict:
            with urllib.request.urlopen(self.http + "/metrics", timeout=5) as r:
                text = r.read().decode()
            return {s.labels["worker"]: s.value for fam in text_string_to_metric_families(text)
                    for s in fam.samples if s.name == "aieng_worker_requests_total"
                    and s.labels.get("role") == role and s.value}

        last: dict = {}

        def added_up() -> bool:
            last.clear()
            last.update(read())
            return sum(last.values()) >= n

        until(added_up, 5, 0.1)
        return last

    def segments(self) -> list[str]:
        return shm.list_segments(str(self.pid))

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        kids = list(psutil.Process(self.pid).children(recursive=True))
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        # never leave a worker behind, whatever happened: each is gone or a zombie (it exited; only the
        # reaping is left, and an orphan's reaper here, pid 1, reaps about once a second) within 5 s
        until(lambda: all(exited(k) for k in kids), 5, 0.02)
        for k in kids:
            if not exited(k):
                k.kill()
        self.log.close()
        return code


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One server with every demo model, shared by the read-only e2e tests."""
    srv = ServerProcess(tmp_path_factory.mktemp("server"), AIENG_PREPROCESS_WORKERS="2",
                        AIENG_POSTPROCESS_WORKERS="1").start()
    yield srv
    code = srv.stop()
    assert code == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


@pytest.fixture
def make_server(tmp_path):
    """Factory for servers a test may break; each is stopped and checked for leaks."""
    made: list[ServerProcess] = []

    def make(**env: str) -> ServerProcess:
        srv = ServerProcess(tmp_path, **env)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()
        assert srv.segments() == [], f"shared memory left behind: {srv.segments()}"


def save_tensor_model(repo, name: str, graph, version: str = "1", input_name: str = "x") -> None:
    """Write an ONNX graph as a tensor-in, tensor-out model directory ``<repo>/<name>/<version>`` (the
    tests' own small models: no batching, tensor pre- and postprocessing)."""
    from tests.onnx_files import save_onnx

    d = repo / name / version
    save_onnx(d / "model.onnx", graph)
    (d / "model.yaml").write_text(
        f"inputs: [{{name: {input_name}, kind: tensor}}]\noutputs: [{{name: y, kind: tensor}}]\n"
        "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
        "batching: {max_batch_size: 1, max_wait_ms: 0}\n")


def pytest_collection_modifyitems(items: list) -> None:
    """Every test under tests/e2e starts the real server: marked ``e2e``, so ``-m "not e2e"`` runs the
    unit and component tests alone (about a minute).  A test that drives the browser is marked ``browser``
    in its module: scripts/test.sh runs those after the rest, one at a time, since Chromium on a 2-core
    machine starves the timing-bound tests beside it."""
    for item in items:
        if f"{os.sep}e2e{os.sep}" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
