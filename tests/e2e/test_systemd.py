"""systemd integration: the shipped unit verifies, and the server speaks the notify
protocol to a real datagram socket standing in for systemd (READY=1 only once
ready, WATCHDOG=1 while healthy, STATUS=, STOPPING=1)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_unit_file_verifies(tmp_path):
    text = open(os.path.join(ROOT, "deploy", "aieng.service")).read()
    aieng = os.path.join(ROOT, ".venv", "bin", "aieng")
    text = text.replace("/opt/aieng/.venv/bin/aieng", aieng).replace("/opt/aieng", ROOT)
    text = text.replace("User=aieng", "User=root").replace("Group=aieng", "Group=root")
    unit = tmp_path / "aieng.service"
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "aieng.service" not in (r.stdout + r.stderr), r.stdout + r.stderr  # no warning about our unit
    for key in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "EnvironmentFile=", "KillMode=mixed",
                "TimeoutStopSec=", "NoNewPrivileges=yes", "ProtectSystem=", "PrivateTmp=yes"):
        assert key in text


def test_notify_protocol(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.5)
    srv = ServerProcess(tmp_path, AIENG_MODELS="tabular", NOTIFY_SOCKET=path, WATCHDOG_USEC="1000000",
                        AIENG_HANG_TIMEOUT_S="60")
    got: list[tuple[float, str]] = []

    def collect(until: float) -> None:
        while time.monotonic() < until:
            try:
                got.append((time.monotonic(), sock.recv(4096).decode()))
            except socket.timeout:
                pass

    try:
        srv.start(wait=False)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("READY=1" in g for _, g in got):
            collect(time.monotonic() + 0.5)
        ready_at = next(t for t, g in got if "READY=1" in g)
        h = srv.wait_ready(10)
        assert h["ready"]
        # READY=1 came once and only after startup; STATUS lines are human-readable
        assert sum("READY=1" in g for _, g in got) == 1
        assert any(g.startswith("STATUS=starting") for _, g in got)
        assert "STATUS=serving tabular:1" in next(g for _, g in got if "READY=1" in g)
        assert not any("WATCHDOG=1" in g for t, g in got if t < ready_at)
        collect(time.monotonic() + 2.5)  # WATCHDOG_USEC=1 s: a ping every 0.5 s while healthy
        pings = [t for t, g in got if g == "WATCHDOG=1"]
        assert len(pings) >= 3, got
        # a stuck executor (alive to the OS, silent) is not a healthy pipeline: the pings stop
        # once it has been silent for 5 s, and resume when it answers again
        pid = srv.child_pid("aieng::executor")
        stopped = time.monotonic()
        os.kill(pid, 19)  # SIGSTOP
        try:
            got.clear()
            collect(time.monotonic() + 8.0)
        finally:
            os.kill(pid, 18)  # SIGCONT
        pings = [t for t, g in got if g == "WATCHDOG=1"]
        late_pings = [t for t in pings if t > stopped + 6.0]
        assert not late_pings, f"pings went on while the executor was stuck: {pings}"
        got.clear()
        collect(time.monotonic() + 3.0)
        assert any(g == "WATCHDOG=1" for _, g in got), "pings resume once it is back"
        assert srv.child_pid("aieng::executor") == pid  # stuck, not killed: the hang timeout is longer
        os.kill(pid, 9)  # a death is reported in a human-readable STATUS line
        got.clear()
        collect(time.monotonic() + 2.0)
        assert any("STATUS=executor died" in g for _, g in got), got
        srv.wait_ready(60)
        srv.proc.send_signal(15)
        collect(time.monotonic() + 3)
        assert any("STOPPING=1" in g for _, g in got)
    finally:
        srv.stop()
        sock.close()
    assert srv.segments() == []
