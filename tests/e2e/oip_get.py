"""One plain HTTP request to a running server's OIP port, for the page and document tests: ``(status,
headers lower-cased, body bytes)``, an HTTP error status returned like any other; ``token`` goes as
``Authorization: Bearer``; a ``body`` is sent as JSON (POST unless ``method`` says otherwise)."""
from __future__ import annotations

import urllib.error
import urllib.request


def oip_get(srv, path: str, token: str | None = None, method: str | None = None,
            body: bytes | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(f"http://{srv.oip_http}{path}", data=body, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()
