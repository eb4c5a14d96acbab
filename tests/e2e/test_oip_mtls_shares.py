"""Fair shares per certificate under mutual TLS (issue 37): with no API keys, a verified client certificate's
subject is the request's principal (``cert:<subject>``), so alice keeping 64 requests of 32 rows in flight
over gRPC-TLS leaves bob, from the same address with a certificate of his own, every answer; alice's overflow
is refused as one client's (counted per address, as before, bob shared alice's budget and was refused too);
the same over HTTPS, alice on eight connections."""
from __future__ import annotations

import http.client
import json
import ssl
import threading
import time

import grpc
import pytest
import tritonclient.grpc as tg

from tests.e2e.grpc_flood import GrpcFlood, one_at_a_time
from tests.tlscerts import Ca
from tests.waits import until

pytestmark = pytest.mark.e2e


def mtls_server(make_server, tmp_path):
    """A server of ``tabular`` under mutual TLS, its CA, and two clients' certificates: alice's and bob's."""
    ca = Ca(tmp_path / "ca", "tenants")
    server = ca.issue("server", "server-1", server=True)
    srv = make_server(AIENG_MODELS="tabular", AIENG_OIP_TLS_CERT_FILE=str(server.cert),
                      AIENG_OIP_TLS_KEY_FILE=str(server.key),
                      AIENG_OIP_TLS_CLIENT_CA_FILE=str(ca.cert)).start()
    return srv, ca, ca.issue("alice", "alice"), ca.issue("bob", "bob")


def test_two_certificates_from_one_address_each_keep_their_share(make_server, tmp_path):
    srv, ca, alice, bob = mtls_server(make_server, tmp_path)
    creds = grpc.ssl_channel_credentials(ca.cert.read_bytes(), alice.key.read_bytes(),
                                         alice.cert.read_bytes())
    with GrpcFlood(lambda: grpc.secure_channel(srv.oip_grpc, creds)) as flood:  # alice's
        assert flood.bites()
        answered = one_at_a_time(tg.InferenceServerClient(
            srv.oip_grpc, ssl=True, root_certificates=str(ca.cert), private_key=str(bob.key),
            certificate_chain=str(bob.cert)))
    assert answered == [f"b{i}" for i in range(40)]
    assert flood.refused_for_its_share(), flood.refused()[:3]
    assert {code for code, _ in flood.outcomes} == {"OK", "UNAVAILABLE"}


def test_over_https_too(make_server, tmp_path):
    srv, ca, alice, bob = mtls_server(make_server, tmp_path)
    host, port = srv.oip_http.rsplit(":", 1)
    wide = json.dumps({"inputs": [{"name": "bill_length_mm", "datatype": "FP32", "shape": [32],
                                   "data": [40.0] * 32}]})
    stop = threading.Event()
    statuses: list[int] = []  # alice's

    def context(pair) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(ca.cert))
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        return ctx

    def flood():  # one of alice's eight connections, each a 32-row request after another
        conn = http.client.HTTPSConnection(host, int(port), context=context(alice), timeout=30)
        end = time.monotonic() + 60  # bounded in time and count
        try:
            while not stop.is_set() and time.monotonic() < end and len(statuses) < 20000:
                conn.request("POST", "/v2/models/tabular/infer", wide, {"Content-Type": "application/json"})
                res = conn.getresponse()
                res.read()
                statuses.append(res.status)
        finally:
            conn.close()

    flooders = [threading.Thread(target=flood) for _ in range(8)]
    for t in flooders:
        t.start()
    answered: list[str] = []
    try:
        assert until(lambda: 503 in statuses, 30, 0.05)  # the flood bites
        conn = http.client.HTTPSConnection(host, int(port), context=context(bob), timeout=30)
        try:
            for i in range(20):
                body = json.dumps({"id": f"b{i}", "inputs": [{"name": "bill_length_mm", "datatype": "FP32",
                                                              "shape": [1], "data": [40.0 + i]}]})
                conn.request("POST", "/v2/models/tabular/infer", body, {"Content-Type": "application/json"})
                res = conn.getresponse()
                answer = json.loads(res.read())
                assert res.status == 200, answer
                answered.append(answer["id"])
        finally:
            conn.close()
    finally:
        stop.set()
        for t in flooders:
            t.join(90)
    assert answered == [f"b{i}" for i in range(20)]
    assert set(statuses) == {200, 503}
