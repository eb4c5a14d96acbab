"""The probe port over HTTPS when configured (issue 37: "the probe port keeps plain HTTP for kubelet
probes unless configured"): with ``AIENG_HTTP_TLS=1`` it serves the OIP doors' certificate, asks no client
certificate (a kubelet's HTTPS probe presents none), answers a plain-HTTP request with nothing, and picks up
rotated files at the first request after the rotation; without a certificate to serve the start is refused
in one line naming the variable."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import MODELS, ROOT, ServerProcess
from tests.e2e.tls_helpers import client_context, make_pki, peer_cn, read_all
from tests.waits import until

pytestmark = pytest.mark.e2e
CURL = "/usr/bin/curl"


def test_the_probe_port_speaks_https_with_the_oip_certificate_and_rotates_it(tmp_path):
    pki = make_pki(tmp_path / "pki")
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    (tmp_path / "srv").mkdir()
    srv = ServerProcess(tmp_path / "srv", AIENG_MODELS="tabular", AIENG_OIP_TLS_CERT_FILE=str(cert),
                        AIENG_OIP_TLS_KEY_FILE=str(key), AIENG_OIP_TLS_CLIENT_CA_FILE=str(pki.ca.cert),
                        AIENG_HTTP_TLS="1").start()
    try:
        url = f"https://127.0.0.1:{srv.http_port}/readyz"
        out = subprocess.run([CURL, "-sS", "--max-time", "20", "--cacert", str(pki.ca.cert),
                              "-o", "/dev/null", "-w", "%{http_code}", url], capture_output=True, text=True,
                             timeout=30)
        assert out.stdout == "200", out  # no client certificate, though the OIP doors ask for one
        with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as raw:  # plain HTTP
            raw.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert b"HTTP/1.1" not in read_all(raw)
        ctx = client_context(pki.ca.cert)
        assert peer_cn(srv.http_port, ctx) == "server-1"
        rotated = pki.ca.issue("server2", "server-2", server=True)
        for src, dst in ((rotated.cert, cert), (rotated.key, key)):
            tmp = dst.with_suffix(".new")
            shutil.copy(src, tmp)
            os.replace(tmp, dst)

        def new_certificate() -> bool:  # a request polls the files; the next handshake gets the new pair
            subprocess.run([CURL, "-sS", "--max-time", "5", "--cacert", str(pki.ca.cert), "-o", "/dev/null",
                            url], capture_output=True, timeout=30)
            return peer_cn(srv.http_port, ctx) == "server-2"

        assert until(new_certificate, 30, 0.5)
    finally:
        assert srv.stop() == 0, srv.output()


def test_without_a_certificate_to_serve_the_start_is_refused_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_MODEL_REPOSITORY=MODELS, AIENG_HTTP_TLS="1")
    out = subprocess.run([sys.executable, "-m", "aieng.cli", "serve"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "http_tls needs oip_tls_cert_file" in lines[0], out.stderr
