"""A door's server-side TLS, from PEM files that may be rotated while the door serves.

``load(files)`` reads a certificate chain, its private key and (for mutual TLS) a client CA bundle into a
``Loaded``: an ``ssl.SSLContext`` (server side, TLS 1.2 at least; with a client CA a client must present a
certificate that CA signed, else the handshake fails) and the PEM bytes a gRPC server wants.  A file that is
missing, unreadable, not PEM, an encrypted key, or a key that does not match the certificate raises
``TlsError`` naming which of the three files (``field``: cert | key | client_ca).

``ServerTls`` owns the live state.  ``context`` is the one SSLContext a listener is given, once: its
``sni_callback`` (OpenSSL's servername callback, run for every ClientHello, with SNI or without) hands each
new handshake the newest loaded context, so a connection already open keeps the certificate it shook hands
with and is never dropped.  ``poll(now)``, called from the owner's loop (not per request), stats the files at
most once per ``interval_s``; when a file's (mtime, size, inode, device) changed, it loads them all again: on
success the new context serves every new handshake and ``on_load`` is called (the gRPC door's hook); on
failure the old one stays, and the error is logged once per change of the files.  A load whose files changed
while being read is tried again at the next poll (a rotation caught halfway).  Nothing here runs per request.
"""
from __future__ import annotations

import logging
import os
import re
import ssl
from dataclasses import dataclass
from typing import Callable

# dotted names of a subject's attributes as RFC 4514 writes them (the rest keep Python's long name)
SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
         "localityName": "L", "stateOrProvinceName": "ST", "domainComponent": "DC", "userId": "UID",
         "streetAddress": "STREET"}


class TlsError(ValueError):
    """A TLS file that cannot serve; ``field`` says which (cert, key or client_ca)."""

    def __init__(self, field: str, reason: str):
        super().__init__(reason)
        self.field = field


@dataclass(frozen=True)
class TlsFiles:
    cert: str  # PEM certificate chain, the server's first
    key: str  # PEM private key of that certificate (unencrypted)
    client_ca: str = ""  # PEM CA bundle: set, clients must present a certificate one of these signed

    def paths(self) -> tuple[str, ...]:
        return (self.cert, self.key, self.client_ca) if self.client_ca else (self.cert, self.key)


@dataclass(frozen=True)
class Loaded:
    context: ssl.SSLContext
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes | None  # None: no client certificates asked for
    stamps: tuple  # the files' stamps when read


def stamps(files: TlsFiles) -> tuple:
    """What tells a rotated file from the one loaded (None for a file that cannot be stat'ed)."""
    out = []
    for path in files.paths():
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev))
    return tuple(out)


def _read(path: str, field: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise TlsError(field, f"cannot be read: {exc.strerror or exc}") from None


def _no_password() -> bytes:
    raise TlsError("key", "is encrypted: give an unencrypted PEM key (a Secret's tls.key is)")


def load(files: TlsFiles) -> Loaded:
    """Read and check the files; ``TlsError`` names the first that cannot serve (module docstring)."""
    before = stamps(files)
    cert_pem, key_pem = _read(files.cert, "cert"), _read(files.key, "key")
    ca_pem = _read(files.client_ca, "client_ca") if files.client_ca else None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:  # parses every certificate of the chain; load_cert_chain alone does not say which file is bad
        ssl.create_default_context(cadata=cert_pem.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise TlsError("cert", f"holds no PEM certificate ({_reason(exc)})") from None
    try:
        ctx.load_cert_chain(files.cert, files.key, password=_no_password)
    except ssl.SSLError as exc:
        what = "does not match the certificate" if "MISMATCH" in str(exc) else "is not a PEM private key"
        raise TlsError("key", f"{what} ({_reason(exc)})") from None
    except OSError as exc:
        raise TlsError("key", f"cannot be read: {exc.strerror or exc}") from None
    if ca_pem is not None:
        try:
            ctx.load_verify_locations(cadata=ca_pem.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise TlsError("client_ca", f"holds no PEM CA certificate ({_reason(exc)})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["http/1.1"])
    return Loaded(ctx, cert_pem, key_pem, ca_pem, before)


def _reason(exc: Exception) -> str:
    return getattr(exc, "reason", None) or re.sub(r" \(_ssl\.c:\d+\)", "", str(exc).splitlines()[0])


def subject_text(peercert: dict | None) -> str | None:
    """A verified client certificate's subject (``getpeercert()``'s dict): its common name, else the whole
    subject as RFC 4514 text (most specific first); None without one."""
    if not peercert:
        return None
    rdns = peercert.get("subject") or ()
    for rdn in rdns:
        for key, value in rdn:
            if key == "commonName":
                return value
    parts = ["+".join(f"{SHORT.get(k, k)}={_escape(v)}" for k, v in rdn) for rdn in reversed(rdns)]
    return ",".join(parts) or None


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out[:1] in ("#", " "):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out


class ServerTls:
    """The live TLS state of one process's doors (module docstring)."""

    def __init__(self, files: TlsFiles, log: logging.Logger, labels: dict[str, str] | None = None,
                 interval_s: float = 1.0, on_load: Callable[[Loaded], None] | None = None):
        self.files, self.log, self.interval_s, self.on_load = files, log, interval_s, on_load
        self.labels = labels or {}  # field -> what the operator calls it (a variable's name), for the log
        self.current = load(files)  # a start with files that cannot serve fails here
        self.context = load(files).context  # the listener's: its callback picks ``current`` per handshake
        self.context.sni_callback = self._pick
        self.failed: tuple | None = None  # the stamps a load failed on: not tried again until they change
        self.next_poll = 0.0
        self.reloads = 0

    def _pick(self, sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        # the verify mode stays the listener's (OpenSSL keeps it per connection); the certificate, key and
        # the CA store come from the context set here
        sslobj.context = self.current.context

    def poll(self, now: float) -> bool:
        """At most once per ``interval_s``: reload when a file changed; True when a new one now serves."""
        if now < self.next_poll:
            return False
        self.next_poll = now + self.interval_s
        seen = stamps(self.files)
        if seen == self.current.stamps or seen == self.failed:
            return False
        try:
            loaded = load(self.files)
        except TlsError as exc:
            self.failed = seen
            path = {"cert": self.files.cert, "key": self.files.key}.get(exc.field, self.files.client_ca)
            self.log.error("TLS files changed but cannot serve, the previous certificate stays: %s %r %s",
                           self.labels.get(exc.field, exc.field), path, exc)
            return False
        if loaded.stamps != stamps(self.files):  # rewritten while read: the next poll reads it whole
            self.next_poll = now
            return False
        self.current, self.failed = loaded, None
        self.reloads += 1
        if self.on_load is not None:
            self.on_load(loaded)
        self.log.info("TLS files reloaded: new handshakes use the new certificate")
        return True
