"""TLS below the gateway (aieng/httpcore/tls.py, aieng/gateway/tls.py, the config's checks), in-process
with certificates made here: the checks that name the variable, the load that names the file, the poll that
reloads a rotated file (and keeps the old one when the new one does not load), the client subject an HTTP
handler and a gRPC call see, and a client CA bundle that rotates too."""
from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import grpc
import pytest

from aieng.config import load_config
from aieng.gateway.tls import grpc_credentials, subject_reader, tls_subject
from aieng.httpcore import server as httpd
from aieng.httpcore.tls import ServerTls, TlsError, TlsFiles, load, subject_text
from aieng.runtime.instance import ConfigError, check_tls
from tests.tlscerts import Ca

LOG = logging.getLogger("test.tls")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = Ca(d / "good", "good"), Ca(d / "other", "other")
    return {"ca": ca, "other": other, "server": ca.issue("server", "server-1", server=True),
            "server2": ca.issue("server2", "server-2", server=True), "alice": ca.issue("alice", "alice"),
            "org": ca.issue("org", "", org="tenants, east"), "bob": other.issue("bob", "bob")}


def copy(src: Path, dst: Path) -> Path:
    tmp = dst.with_name(dst.name + ".new")
    tmp.write_bytes(src.read_bytes())
    os.replace(tmp, dst)
    return dst


# ------------------------------------------------------------ configuration
@pytest.mark.parametrize("env, what", [
    ({"AIENG_OIP_TLS_CERT_FILE": "/c"}, r"oip_tls_cert_file needs oip_tls_key_file \(AIENG_OIP_TLS_KEY_"),
    ({"AIENG_OIP_TLS_KEY_FILE": "/k"}, r"oip_tls_key_file needs oip_tls_cert_file \(AIENG_OIP_TLS_CERT_"),
    ({"AIENG_OIP_TLS_CLIENT_CA_FILE": "/ca"}, "oip_tls_client_ca_file needs oip_tls_cert_file"),
])
def test_the_tls_variables_go_together(env, what):
    (name,) = env
    with pytest.raises(ValueError, match=f"^invalid configuration: {what}.* \\(from env:{name}\\)$"):
        load_config(environ=env)


def test_all_three_make_a_config_without_reading_the_files():
    cfg = load_config(environ={"AIENG_OIP_TLS_CERT_FILE": "/c", "AIENG_OIP_TLS_KEY_FILE": "/k",
                               "AIENG_OIP_TLS_CLIENT_CA_FILE": "/ca"})
    assert (cfg.oip_tls_cert_file, cfg.oip_tls_key_file, cfg.oip_tls_client_ca_file) == ("/c", "/k", "/ca")
    assert cfg.sources["oip_tls_client_ca_file"] == "env:AIENG_OIP_TLS_CLIENT_CA_FILE"


@pytest.mark.parametrize("which, why", [
    ("key", "AIENG_OIP_TLS_KEY_FILE '.*alice.key' does not match the certificate \\(KEY_VALUES_MISMATCH\\)"),
    ("cert", "AIENG_OIP_TLS_CERT_FILE '.*nope' cannot be read: No such file or directory"),
    ("client_ca",
     "AIENG_OIP_TLS_CLIENT_CA_FILE '.*server.key' holds no PEM CA certificate \\(no start line: .*\\)"),
])
def test_check_tls_names_the_variable(pki, which, why):
    server = pki["server"]
    env = {"AIENG_OIP_TLS_CERT_FILE": str(server.cert), "AIENG_OIP_TLS_KEY_FILE": str(server.key),
           "AIENG_OIP_TLS_CLIENT_CA_FILE": str(pki["ca"].cert)}
    bad = {"key": ("AIENG_OIP_TLS_KEY_FILE", str(pki["alice"].key)),
           "cert": ("AIENG_OIP_TLS_CERT_FILE", str(pki["ca"].dir / "nope")),
           "client_ca": ("AIENG_OIP_TLS_CLIENT_CA_FILE", str(pki["server"].key))}[which]
    env[bad[0]] = bad[1]
    cfg = load_config(environ=env)
    with pytest.raises(ConfigError, match=f"^invalid configuration: {why} \\(from env:{bad[0]}\\)$"):
        check_tls(cfg)
    check_tls(load_config(environ={**env, "AIENG_OIP_HTTP_ADDR": "", "AIENG_OIP_GRPC_ADDR": ""}))  # no door


def test_an_encrypted_key_is_refused_without_asking_for_a_password(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki["server"].key.read_bytes(), None)
    enc = tmp_path / "enc.key"
    enc.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(TlsError, match="is encrypted") as err:
        load(TlsFiles(str(pki["server"].cert), str(enc)))
    assert err.value.field == "key"


def test_the_server_context_is_tls12_at_least_and_mutual_only_with_a_ca(pki):
    plain = load(TlsFiles(str(pki["server"].cert), str(pki["server"].key)))
    mutual = load(TlsFiles(str(pki["server"].cert), str(pki["server"].key), str(pki["ca"].cert)))
    assert plain.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert (plain.context.verify_mode, plain.ca_pem) == (ssl.CERT_NONE, None)
    assert (mutual.context.verify_mode, mutual.ca_pem) == (ssl.CERT_REQUIRED, pki["ca"].cert.read_bytes())


# ------------------------------------------------------------ the poll
def test_poll_reloads_a_rotated_pair_and_keeps_the_old_one_when_the_new_does_not_load(pki, tmp_path, caplog):
    cert, key = copy(pki["server"].cert, tmp_path / "tls.crt"), copy(pki["server"].key, tmp_path / "tls.key")
    loads = []
    tls = ServerTls(TlsFiles(str(cert), str(key)), LOG, {"key": "AIENG_OIP_TLS_KEY_FILE"}, interval_s=1.0,
                    on_load=loads.append)
    first = tls.current
    assert tls.poll(100.0) is False  # nothing changed
    copy(pki["alice"].key, key)  # a key of another certificate
    assert tls.poll(100.5) is False and tls.current is first  # within the interval: not even looked at
    with caplog.at_level(logging.ERROR, LOG.name):
        assert tls.poll(101.0) is False and tls.current is first
        assert tls.poll(102.0) is False  # the same broken files: not tried, not logged again
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "AIENG_OIP_TLS_KEY_FILE" in errors[0] and "does not match" in errors[0]
    copy(pki["server2"].key, key)
    copy(pki["server2"].cert, cert)
    assert tls.poll(103.0) is True
    assert tls.current is not first and loads == [tls.current] and tls.reloads == 1
    assert tls.current.cert_pem == pki["server2"].cert.read_bytes()


# ------------------------------------------------------------ what a handler sees
async def subject_echo(method, path, query, headers, body, peer):
    return 200, {}, repr(peer.subject).encode()


async def fetch(port: int, ctx: ssl.SSLContext | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                   server_hostname="127.0.0.1" if ctx else None)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    try:
        data = await asyncio.wait_for(reader.read(), 10)
    except (ConnectionResetError, ssl.SSLError):
        data = b""
    writer.close()
    return data.split(b"\r\n\r\n", 1)[-1]


def client(ca: Ca, pair=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    if pair is not None:
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
    return ctx


def test_an_http_handler_sees_the_client_certificate_subject_and_the_ca_rotates(pki, tmp_path):
    ca_file = copy(pki["ca"].cert, tmp_path / "ca.crt")
    tls = ServerTls(TlsFiles(str(pki["server"].cert), str(pki["server"].key), str(ca_file)), LOG)

    async def go():
        srv = httpd.HttpServer(subject_echo, 1000, 5.0, 5.0, 16, LOG, tls=tls.context)
        await srv.start("127.0.0.1", 0)
        port = srv.server.sockets[0].getsockname()[1]
        plain = httpd.HttpServer(subject_echo, 1000, 5.0, 5.0, 16, LOG)
        await plain.start("127.0.0.1", 0)
        out = [await fetch(port, client(pki["ca"], pki["alice"])),
               await fetch(port, client(pki["ca"], pki["org"])),
               await fetch(port, client(pki["ca"], pki["bob"])),
               await fetch(plain.server.sockets[0].getsockname()[1], None)]
        copy(pki["other"].cert, ca_file)  # the client CA bundle rotated: bob's CA in, alice's out
        assert tls.poll(1e12) is True
        for pair in (pki["bob"], pki["alice"]):
            out.append(await fetch(port, client(pki["ca"], pair)))
        await srv.close(1)
        await plain.close(1)
        return out

    alice, org, bob, plain, bob_after, alice_after = asyncio.run(asyncio.wait_for(go(), 60))
    assert (alice, org, bob, plain) == (b"'alice'", b"'O=tenants\\\\, east'", b"", b"None")
    assert (bob_after, alice_after) == (b"'bob'", b"")


def test_subject_text_without_a_common_name_is_rfc4514():
    cert = {"subject": ((("countryName", "DE"),), (("organizationName", "#a+b"),),
                        (("organizationalUnitName", "x"), ("userId", "u1")))}
    assert subject_text(cert) == "OU=x+UID=u1,O=\\#a\\+b,C=DE"
    assert subject_text(None) is None and subject_text({}) is None


# ------------------------------------------------------------ what a gRPC call sees
def test_a_grpc_call_sees_the_client_certificate_subject(pki):
    files = TlsFiles(str(pki["server"].cert), str(pki["server"].key), str(pki["ca"].cert))
    tls = ServerTls(files, LOG)

    async def whoami(request: bytes, context) -> bytes:
        return repr(tls_subject(context)).encode()

    async def go():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "t.Who", {"Am": grpc.unary_unary_rpc_method_handler(whoami)}),))
        port = server.add_secure_port("127.0.0.1:0", grpc_credentials(tls))
        await server.start()
        out = []
        for pair in (pki["alice"], pki["org"]):
            creds = grpc.ssl_channel_credentials(pki["ca"].cert.read_bytes(), pair.key.read_bytes(),
                                                 pair.cert.read_bytes())
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
                out.append(await channel.unary_unary("/t.Who/Am")(b"", timeout=10))
        await server.stop(0)
        return out

    assert asyncio.run(asyncio.wait_for(go(), 60)) == [b"'alice'", b"'O=tenants\\\\, east'"]


def test_the_grpc_subject_is_read_only_under_mutual_tls():
    assert subject_reader(load_config(environ={})) is None
    on = load_config(environ={"AIENG_OIP_TLS_CERT_FILE": "/c", "AIENG_OIP_TLS_KEY_FILE": "/k",
                              "AIENG_OIP_TLS_CLIENT_CA_FILE": "/ca"})
    assert subject_reader(on) is tls_subject
