"""The OIP gateway shared fairly (issue 20, findings 4 and 6), against the real server.

Finding 6: the frontend sees a gateway as one client, so one OIP client with many multi-row requests
took the whole gateway's budget (another OIP client 5 of 29 OK) and the rows its refused requests had
already sent ran for nothing.  Finding 4: a 32 MiB JSON body was decoded on the gateway's loop, which
then served nobody for 2.5-3 s per body.  Two OIP clients are told apart by their address: the victims
here connect from 127.0.0.2 (all of 127/8 is loopback), the attacker from 127.0.0.1.
"""
from __future__ import annotations

import http.client
import json
import select
import socket
import threading

import grpc
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2_grpc as pbg

from aieng.client import Client
from tests.e2e.grpc_flood import GrpcFlood, wide_request
from tests.e2e.rollout_helpers import srv_metrics
from tests.waits import until

ROW = {"island": "Biscoe", "bill_length_mm": 45.1, "bill_depth_mm": 14.5, "flipper_length_mm": 215.0,
       "body_mass_g": 5000.0, "sex": "female"}


class FromAddress(http.client.HTTPConnection):
    """An HTTP connection from a chosen loopback address (a second OIP client, to the gateway)."""

    def __init__(self, addr: str, source: str):
        host, port = addr.rsplit(":", 1)
        super().__init__(host, int(port), timeout=30, source_address=(source, 0))


def small_infer(conn: http.client.HTTPConnection, i: int) -> tuple[int, str]:
    body = json.dumps({"id": f"v{i}", "inputs": [{"name": "bill_length_mm", "datatype": "FP32", "shape": [1],
                                                  "data": [40.0 + i]}]})
    conn.request("POST", "/v2/models/tabular/infer", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, (json.loads(data).get("id", "") if resp.status == 200 else data.decode())


def frontend_rows(srv) -> float:
    return sum(s.value for fam in text_string_to_metric_families(srv_metrics(srv)) for s in fam.samples
               if s.name == "aieng_requests_total" and s.labels.get("model") == "tabular")


def test_one_oip_client_cannot_deny_other_oip_or_native_clients(make_server):
    srv = make_server(AIENG_MODELS="tabular").start()
    with GrpcFlood(lambda: grpc.insecure_channel(srv.oip_grpc)) as attack:  # the attacker
        assert attack.bites()  # the attack bites
        victim = FromAddress(srv.oip_http, "127.0.0.2")
        victim_answers = [small_infer(victim, i) for i in range(30)]
        victim.close()
        with Client(srv.addr) as native:
            native_codes = [native.infer("tabular", ROW, timeout_ms=10000).get("code", "OK")
                            for _ in range(30)]
    assert victim_answers == [(200, f"v{i}") for i in range(30)]
    assert native_codes == ["OK"] * 30
    assert attack.refused_for_its_share(), attack.refused()[:3]
    assert {code for code, _ in attack.outcomes} == {"OK", "UNAVAILABLE"}


def test_a_refused_multi_row_request_sends_none_of_its_rows(make_server):
    """Before, a request whose rows did not all fit was refused after some of them had been sent."""
    srv = make_server(AIENG_MODELS="tabular", AIENG_MAX_INFLIGHT="64").start()  # share 32, 16 per peer
    ok = refused = 0
    with grpc.insecure_channel(srv.oip_grpc) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        for _ in range(5):
            calls = [stub.ModelInfer.future(wide_request(12), timeout=30) for _ in range(16)]
            for call in calls:
                try:
                    call.result()
                    ok += 1
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                    refused += 1
    assert ok and refused
    want = 12.0 * ok  # only the answered requests' rows ever reached the frontend
    until(lambda: frontend_rows(srv) == want, 5, 0.1)  # /metrics is rendered every AIENG_SNAPSHOT_MS
    assert frontend_rows(srv) == want


def test_a_huge_json_body_does_not_stall_the_gateway(make_server):
    """Four 25 MiB JSON bodies of 6.7 million BYTES elements each are decoded one after another; small
    requests from another client are answered before the first of them is."""
    srv = make_server(AIENG_MODELS="tabular").start()
    n = 6_700_000
    body = json.dumps({"inputs": [{"name": "island", "datatype": "BYTES", "shape": [n],
                                   "data": [""] * n}]}).encode()
    head = (b"POST /v2/models/tabular/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    host, port = srv.oip_http.rsplit(":", 1)
    big = [socket.create_connection((host, int(port)), timeout=120) for _ in range(4)]
    try:
        senders = [threading.Thread(target=s.sendall, args=(head + body,)) for s in big]
        for t in senders:
            t.start()
        for t in senders:
            t.join(120)
        first_big = threading.Event()

        def wait_first():  # any of them answering ends the count
            select.select(big, [], [], 120)
            first_big.set()

        watcher = threading.Thread(target=wait_first)
        watcher.start()
        victim = FromAddress(srv.oip_http, "127.0.0.2")
        answered_before = 0
        for i in range(200):
            if first_big.is_set():
                break
            assert small_infer(victim, i) == (200, f"v{i}")
            if not first_big.is_set():
                answered_before += 1
        victim.close()
        watcher.join(120)
        statuses = []
        for s in big:
            s.settimeout(120)
            statuses.append(s.recv(64).split(b" ")[1])
    finally:
        for s in big:
            s.close()
    assert statuses == [b"400"] * 4  # refused after decoding: 6.7 million rows, not one
    assert answered_before >= 3, answered_before
