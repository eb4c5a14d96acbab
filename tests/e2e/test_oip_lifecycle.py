"""The gateway role lives like every other role: titled, supervised and restarted, counted in health and
metrics, several of it sharing the OIP addresses, off when both addresses are empty, a busy address
failing the start with the variable named, and stopped cleanly under OIP load on SIGTERM."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import urllib.request

import pytest

from tests.waits import until

pytestmark = pytest.mark.e2e
TABULAR = json.dumps({"inputs": [{"name": "bill_length_mm", "datatype": "FP32", "shape": [1],
                                  "data": [40.0]}]}).encode()


def oip_post(addr: str, body: bytes = TABULAR, timeout: float = 10.0) -> int:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v2/models/tabular/infer", body=body)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def wait_for(cond, timeout_s: float, what: str):
    value = until(cond, timeout_s, 0.1)
    assert value, f"{what} within {timeout_s}s"
    return value


def test_gateway_is_restarted_and_counted(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="1").start()
    assert oip_post(srv.oip_http) == 200
    h = srv.health()
    assert h["processes"]["gw-0"]["role"] == "gateway" and h["processes"]["gw-0"]["alive"]
    old = srv.child_pid("aieng::gateway[0]")
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: srv.health()["processes"]["gw-0"]["restarts"] == 1, 10, "gw-0 restart counted")

    def served_again():
        try:
            return oip_post(srv.oip_http, timeout=2) == 200
        except OSError:
            return False

    wait_for(served_again, 20, "OIP served again after the gateway restarted")
    assert srv.child_pid("aieng::gateway[0]") != old
    assert srv.health()["restarts"]["gateway"] == 1
    with srv.client() as c:  # the native door was never affected
        assert c.infer("tabular", {"island": "Dream"})["ok"]
    metrics = urllib.request.urlopen(f"{srv.http}/metrics", timeout=5).read().decode()
    assert 'aieng_worker_restarts_total{role="gateway"} 1.0' in metrics


def test_two_gateways_share_the_addresses(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="1", AIENG_GATEWAY_WORKERS="2").start()
    assert len({srv.child_pid("aieng::gateway[0]"), srv.child_pid("aieng::gateway[1]")}) == 2
    assert [oip_post(srv.oip_http) for _ in range(8)] == [200] * 8


def test_no_gateway_when_both_addresses_are_empty(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="1", AIENG_OIP_HTTP_ADDR="",
                      AIENG_OIP_GRPC_ADDR="").start()
    assert not [cmd for cmd in srv.children() if cmd.startswith("aieng::gateway")]
    assert "gw-0" not in srv.health()["processes"]


def test_busy_oip_address_fails_the_start_naming_it(make_server):
    with socket.socket() as busy:  # a plain listener (no SO_REUSEPORT), as another program would hold it
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="1",
                          AIENG_OIP_HTTP_ADDR=f"127.0.0.1:{port}").start(wait=False)
        try:
            code = srv.proc.wait(90)
        except subprocess.TimeoutExpired:
            srv.stop()
            raise
    assert code == 1
    assert "AIENG_OIP_HTTP_ADDR" in srv.output()


def test_sigterm_under_oip_load_stops_cleanly(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="1").start()
    statuses: list[int] = []

    def client():
        for _ in range(2000):  # bounded; ends on the first refused connection after the stop
            try:
                statuses.append(oip_post(srv.oip_http, timeout=10))
            except (ConnectionError, http.client.HTTPException, OSError):
                return

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: len(statuses) >= 30, 20, "OIP requests answered before the stop")
    srv.proc.send_signal(signal.SIGTERM)
    code = srv.proc.wait(30)  # bounded: a stop that hangs fails here
    for t in threads:
        t.join(15)
    assert code == 0
    assert not any(t.is_alive() for t in threads)
    assert set(statuses) <= {200, 503}, set(statuses)  # answered or refused while draining, never a 500
    assert srv.segments() == []
