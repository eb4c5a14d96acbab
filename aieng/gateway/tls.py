"""TLS on the gateway's two doors, from ``AIENG_OIP_TLS_*`` (docs/operations.md, "TLS").

``server_tls(cfg, log)``: None when TLS is off, else the process's ``httpcore.tls.ServerTls`` (the HTTP
door's SSLContext, the file watch the gateway's loop polls about once a second).  ``grpc_credentials(tls)``:
grpc's dynamic SSL credentials for the gRPC door, whose fetcher grpc calls at each new handshake: it
answers the configuration loaded since the last call, else None (grpc keeps the one it has), so a rotation
reaches gRPC's new connections as it reaches HTTP's.  ``tls_subject(context)``: a call's verified client
certificate subject (its CN, else the RFC 4514 subject), None without one: read it only when mutual TLS is on
(``subject_reader``), so a door without it pays nothing per call.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import grpc

from aieng import envs
from aieng.config import Config
from aieng.httpcore.tls import Loaded, ServerTls, TlsFiles

FIELDS = {"cert": "oip_tls_cert_file", "key": "oip_tls_key_file", "client_ca": "oip_tls_client_ca_file"}
LABELS = {k: envs.BY_FIELD[v].name for k, v in FIELDS.items()}  # cert -> AIENG_OIP_TLS_CERT_FILE, ...


def files_of(cfg: Config) -> TlsFiles | None:
    if not cfg.oip_tls_cert_file:
        return None
    return TlsFiles(cfg.oip_tls_cert_file, cfg.oip_tls_key_file, cfg.oip_tls_client_ca_file)


def server_tls(cfg: Config, log: logging.Logger) -> ServerTls | None:
    files = files_of(cfg)
    return None if files is None else ServerTls(files, log, LABELS)


class _Fetcher:
    """grpc's certificate configuration fetcher: called on grpc's threads, one handshake at a time; the
    swap of ``pending`` is one attribute read and write under the GIL."""

    def __init__(self) -> None:
        self.pending: grpc.ServerCertificateConfiguration | None = None

    def loaded(self, files: Loaded) -> None:
        self.pending = configuration(files)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        new, self.pending = self.pending, None
        return new


def configuration(files: Loaded) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(files.key_pem, files.cert_pem)], files.ca_pem)


def grpc_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """The gRPC door's credentials; they follow ``tls``'s reloads (``tls.on_load`` is set here)."""
    fetch = _Fetcher()
    tls.on_load = fetch.loaded
    return grpc.dynamic_ssl_server_credentials(configuration(tls.current), fetch,
                                               require_client_authentication=tls.current.ca_pem is not None)


def tls_subject(context: Any) -> str | None:
    """The verified client certificate's common name, else its subject (RFC 4514), of a gRPC call."""
    auth = context.auth_context()
    for key in ("x509_common_name", "x509_subject"):
        values = auth.get(key)
        if values and values[0]:  # a certificate without a CN has an empty x509_common_name
            return values[0].decode("utf-8", "replace")
    return None


def subject_reader(cfg: Config) -> Callable[[Any], str | None] | None:
    """``tls_subject`` where mutual TLS is on (a client certificate is asked for), else None."""
    return tls_subject if cfg.oip_tls_client_ca_file else None
