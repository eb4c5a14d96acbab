"""Mutual TLS on both OIP doors (issue 37), with certificates made here (``tests/tlscerts.py``): a CA the
server trusts, its server certificate for 127.0.0.1, a client certificate, an expired one, and a stranger
signed by another CA.  Clients nobody here wrote (tritonclient over HTTPS and gRPC-TLS, curl) infer and get
the right answer; every client the server must not serve is refused at the handshake and reads nothing of an
answer: one trusting another CA (its own verification fails), plain HTTP on the TLS port, and under mutual
TLS no certificate, a stranger's, an expired one.  The probe port stays plain HTTP."""
from __future__ import annotations

import json
import ssl
import subprocess
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.e2e.tls_helpers import answer, client_context, make_pki, tls_server

pytestmark = pytest.mark.e2e
X = np.arange(6, dtype=np.float32).reshape(2, 3)
INFER = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                "data": X.ravel().tolist()}]})


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, pki):
    server = tls_server(tmp_path_factory.mktemp("mtls"), pki, mutual=True).start()
    yield server
    assert server.stop() == 0, server.output()
    assert server.segments() == []
    assert "Traceback" not in server.output()  # refused handshakes are not errors of the server


def grpc_client(srv, pki, pair, ca=None) -> tg.InferenceServerClient:
    return tg.InferenceServerClient(srv.oip_grpc, ssl=True, root_certificates=str(ca or pki.ca.cert),
                                    private_key=None if pair is None else str(pair.key),
                                    certificate_chain=None if pair is None else str(pair.cert))


def grpc_infer(client: tg.InferenceServerClient) -> np.ndarray:
    t = tg.InferInput("x", [2, 3], "FP32")
    t.set_data_from_numpy(X)
    return client.infer("transpose", [t]).as_numpy("y")


def test_tritonclient_https_with_a_client_certificate(srv, pki):
    options = {"ca_certs": str(pki.ca.cert), "certfile": str(pki.client.cert), "keyfile": str(pki.client.key)}
    with th.InferenceServerClient(srv.oip_http, ssl=True, ssl_options=options) as c:
        assert c.is_server_ready()
        t = th.InferInput("x", [2, 3], "FP32")
        t.set_data_from_numpy(X)
        np.testing.assert_array_equal(c.infer("transpose", [t]).as_numpy("y"), X.T)


def test_tritonclient_grpc_tls_with_a_client_certificate(srv, pki):
    with grpc_client(srv, pki, pki.client) as g:
        assert g.is_model_ready("transpose")
        np.testing.assert_array_equal(grpc_infer(g), X.T)


def curl(pki, *args: str, pair=None) -> subprocess.CompletedProcess:
    mine = ["--cert", str(pair.cert), "--key", str(pair.key)] if pair is not None else []
    return subprocess.run(["/usr/bin/curl", "-sS", "--max-time", "20", "--cacert", str(pki.ca.cert), *mine,
                           *args], capture_output=True, text=True, timeout=30)


def test_curl_over_https(srv, pki):
    url = f"https://127.0.0.1:{srv.oip_http_port}"
    ready = curl(pki, "-o", "/dev/null", "-w", "%{http_code}", f"{url}/v2/health/ready", pair=pki.client)
    assert (ready.returncode, ready.stdout) == (0, "200"), ready.stderr
    out = curl(pki, "-H", "Content-Type: application/json", "-d", INFER, f"{url}/v2/models/transpose/infer",
               pair=pki.client)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["outputs"][0]["data"] == X.T.ravel().tolist()


def test_a_client_trusting_another_ca_refuses_the_server(srv, pki):
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        answer(srv.oip_http_port, client_context(pki.other.cert, pki.client))
    out = subprocess.run(["/usr/bin/curl", "-sS", "--max-time", "20", "--cacert", str(pki.other.cert),
                          f"https://127.0.0.1:{srv.oip_http_port}/v2/health/ready"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 60 and out.stdout == "", out.stderr  # curl: the peer's certificate not verified
    with grpc_client(srv, pki, pki.client, ca=pki.other.cert) as g:
        with pytest.raises(InferenceServerException) as err:
            grpc_infer(g)
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert "transpose" not in str(err.value)


def test_plain_http_on_the_tls_port_gets_no_answer(srv):
    assert answer(srv.oip_http_port, None) == b""
    with tg.InferenceServerClient(srv.oip_grpc) as g:  # a plaintext gRPC client
        with pytest.raises(InferenceServerException) as err:
            grpc_infer(g)
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert "transpose" not in str(err.value)


@pytest.mark.parametrize("who", ["no certificate", "another CA's", "expired"])
def test_mutual_tls_refuses_at_the_handshake(srv, pki, who):
    pair = {"no certificate": None, "another CA's": pki.stranger, "expired": pki.expired}[who]
    assert answer(srv.oip_http_port, client_context(pki.ca.cert, pair)) == b""
    with grpc_client(srv, pki, pair) as g:
        with pytest.raises(InferenceServerException) as err:
            grpc_infer(g)
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert "transpose" not in str(err.value)
    out = curl(pki, f"https://127.0.0.1:{srv.oip_http_port}/v2/models/transpose", pair=pair)
    assert out.returncode != 0 and out.stdout == "", out.stderr  # the connection closed, no byte of an answer
    with grpc_client(srv, pki, pki.client) as g:  # and the door still serves the clients it should
        np.testing.assert_array_equal(grpc_infer(g), X.T)


def test_the_probe_port_stays_plain_http(srv):
    with urllib.request.urlopen(srv.http + "/readyz", timeout=10) as r:
        assert r.status == 200
