"""TLS on both OIP doors without client certificates, the rotation of the server's files without a restart,
and the start refused for files that cannot serve (issue 37).

Rotation as Kubernetes does it (each file replaced by a rename): a key that does not load keeps the old
certificate and logs one error; a new pair (another serial, CN server-2) reaches every new handshake of both
doors within the polling interval, while a keep-alive HTTPS connection and a gRPC channel opened before go on
being answered over the connection they had."""
from __future__ import annotations

import http.client
import os
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th

from tests.conftest import ROOT, ServerProcess
from tests.e2e.tls_helpers import client_context, make_pki, peer_cn, tls_server
from tests.waits import until

pytestmark = pytest.mark.e2e
X = np.arange(6, dtype=np.float32).reshape(2, 3)


def grpc_infer(client) -> np.ndarray:
    t = tg.InferInput("x", [2, 3], "FP32")
    t.set_data_from_numpy(X)
    return client.infer("transpose", [t]).as_numpy("y")


def replace(path, data: bytes) -> None:
    """Write ``path`` whole by a rename, as a Secret's volume or cert-manager does."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def cn_of(conn: http.client.HTTPSConnection) -> str:
    return dict(x[0] for x in conn.sock.getpeercert()["subject"])["commonName"]


def test_tls_rotation_without_a_restart(tmp_path):
    pki = make_pki(tmp_path / "pki")
    srv = tls_server(tmp_path, pki, mutual=False).start()
    try:
        ctx = client_context(pki.ca.cert)
        h2 = client_context(pki.ca.cert, alpn="h2")  # gRPC's own handshake: a TLS client that offers h2
        options = {"ca_certs": str(pki.ca.cert)}
        with th.InferenceServerClient(srv.oip_http, ssl=True, ssl_options=options) as c:
            t = th.InferInput("x", [2, 3], "FP32")
            t.set_data_from_numpy(X)
            np.testing.assert_array_equal(c.infer("transpose", [t]).as_numpy("y"), X.T)
        old_grpc = tg.InferenceServerClient(srv.oip_grpc, ssl=True, root_certificates=str(pki.ca.cert))
        np.testing.assert_array_equal(grpc_infer(old_grpc), X.T)
        kept = http.client.HTTPSConnection("127.0.0.1", srv.oip_http_port, context=ctx, timeout=10)
        kept.request("GET", "/v2/health/ready")
        assert kept.getresponse().read() == b"" and cn_of(kept) == "server-1"

        replace(srv.key_file, b"not a key\n")  # a rotation gone wrong: the old certificate stays
        assert until(lambda: "TLS files changed but cannot serve" in srv.output(), 10), srv.output()[-2000:]
        assert "AIENG_OIP_TLS_KEY_FILE" in srv.output()
        assert peer_cn(srv.oip_http_port, ctx) == "server-1"
        assert peer_cn(srv.oip_grpc_port, h2) == "server-1"

        new = pki.ca.issue("server-2", "server-2", server=True)
        assert new.serial != pki.server.serial
        replace(srv.key_file, new.key.read_bytes())
        replace(srv.cert_file, new.cert.read_bytes())
        assert until(lambda: peer_cn(srv.oip_http_port, ctx) == "server-2", 10)
        assert until(lambda: peer_cn(srv.oip_grpc_port, h2) == "server-2", 10)

        kept.request("GET", "/v2/models/transpose")  # the connection opened before the rotation
        reply = kept.getresponse()
        assert reply.status == 200 and b'"transpose"' in reply.read()
        assert cn_of(kept) == "server-1"
        kept.close()
        np.testing.assert_array_equal(grpc_infer(old_grpc), X.T)  # its channel, opened before
        old_grpc.close()
        with tg.InferenceServerClient(srv.oip_grpc, ssl=True, root_certificates=str(pki.ca.cert)) as g:
            np.testing.assert_array_equal(grpc_infer(g), X.T)
    finally:
        code = srv.stop()
    assert code == 0, srv.output()
    assert "Traceback" not in srv.output()


def serve_with(tmp_path, **env: str) -> subprocess.CompletedProcess:
    base = ServerProcess(tmp_path)  # its environment: free ports, no AIENG_* of the caller's
    return subprocess.run([sys.executable, "-m", "aieng.cli", "serve"], cwd=ROOT, env={**base.env, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", ["missing key", "not a certificate", "another key", "bad CA", "cert alone"])
def test_files_that_cannot_serve_refuse_the_start(tmp_path, case):
    pki = make_pki(tmp_path / "pki")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    good = {"AIENG_OIP_TLS_CERT_FILE": str(pki.server.cert), "AIENG_OIP_TLS_KEY_FILE": str(pki.server.key)}
    env, variable, why = {
        "missing key": ({**good, "AIENG_OIP_TLS_KEY_FILE": str(tmp_path / "nope.key")},
                        "AIENG_OIP_TLS_KEY_FILE", "cannot be read: No such file or directory"),
        "not a certificate": ({**good, "AIENG_OIP_TLS_CERT_FILE": str(garbage)},
                              "AIENG_OIP_TLS_CERT_FILE", "holds no PEM certificate"),
        "another key": ({**good, "AIENG_OIP_TLS_KEY_FILE": str(pki.client.key)},
                        "AIENG_OIP_TLS_KEY_FILE", "does not match the certificate"),
        "bad CA": ({**good, "AIENG_OIP_TLS_CLIENT_CA_FILE": str(garbage)},
                   "AIENG_OIP_TLS_CLIENT_CA_FILE", "holds no PEM CA certificate"),
        "cert alone": ({"AIENG_OIP_TLS_CERT_FILE": str(pki.server.cert)},
                       "AIENG_OIP_TLS_KEY_FILE", "set both or neither"),
    }[case]
    out = serve_with(tmp_path, **env)
    said = [line for line in (out.stdout + out.stderr).splitlines() if "invalid configuration" in line]
    assert out.returncode == 2, out.stderr
    assert len(said) == 1 and variable in said[0] and why in said[0], said
    assert "Traceback" not in out.stderr
