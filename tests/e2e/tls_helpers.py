"""What the TLS end-to-end tests share: the certificates of one test module (``Pki``), a server whose OIP
doors speak TLS with them, and two plain clients below tritonclient, for what it cannot show: the
certificate a new connection is given (``peer_cn``) and the bytes a refused connection gets (``answer``)."""
from __future__ import annotations

import shutil
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ServerProcess
from tests.e2e.test_protocol import transpose_model
from tests.tlscerts import Ca, Pair

REQUEST = b"GET /v2/models/transpose HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@dataclass(frozen=True)
class Pki:
    ca: Ca  # signs the server's and the good clients' certificates
    server: Pair  # CN server-1, SANs localhost and 127.0.0.1
    client: Pair  # CN alice, signed by ``ca``
    expired: Pair  # signed by ``ca``, ended yesterday
    stranger: Pair  # CN mallory, signed by ``other``
    other: Ca  # a CA the server does not trust


def make_pki(directory: Path) -> Pki:
    ca, other = Ca(directory / "good", "good"), Ca(directory / "other", "other")
    return Pki(ca, ca.issue("server", "server-1", server=True), ca.issue("client", "alice", org="tenants"),
               ca.issue("expired", "old-alice", expired=True), other.issue("stranger", "mallory"), other)


def tls_server(tmp: Path, pki: Pki, mutual: bool) -> ServerProcess:
    """The transpose model behind TLS doors (mutual TLS with ``mutual``); the server's files are
    copies (``srv.cert_file``/``srv.key_file``) that a test may rotate."""
    repo = tmp / "repo"
    repo.mkdir()
    transpose_model(repo)
    live = tmp / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    env = {"AIENG_MODEL_REPOSITORY": str(repo), "AIENG_PREPROCESS_WORKERS": "1",
           "AIENG_OIP_TLS_CERT_FILE": str(cert), "AIENG_OIP_TLS_KEY_FILE": str(key)}
    if mutual:
        env["AIENG_OIP_TLS_CLIENT_CA_FILE"] = str(pki.ca.cert)
    srv = ServerProcess(tmp, **env)
    srv.cert_file, srv.key_file = cert, key
    return srv


def client_context(ca: Path, pair: Pair | None = None, alpn: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if pair is not None:
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
    if alpn:
        ctx.set_alpn_protocols([alpn])
    return ctx


def peer_cn(port: int, ctx: ssl.SSLContext) -> str:
    """The common name of the certificate a new connection to ``port`` is given."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return dict(x[0] for x in tls.getpeercert()["subject"])["commonName"]


def read_all(sock: socket.socket) -> bytes:
    """What ``sock`` receives until the server closes it (a reset or an unclean TLS end is an end too)."""
    out = b""
    for _ in range(64):
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return out
        if not data:
            return out
        out += data
    return out


def answer(port: int, ctx: ssl.SSLContext | None) -> bytes:
    """The bytes a request for the transpose model's metadata gets back (over TLS with ``ctx``, else in
    plain text); the handshake's own failure on the client's side raises."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        if ctx is None:
            raw.sendall(REQUEST)
            return read_all(raw)
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1", suppress_ragged_eofs=False) as tls:
            try:
                tls.sendall(REQUEST)
            except (BrokenPipeError, ConnectionResetError):
                return b""
            return read_all(tls)
