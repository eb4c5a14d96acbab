"""The API-key check at both OIP doors (``apikeys.KeyRing``), before any routing, in one place.

Open without a key: server liveness and readiness (``/v2/health/live``, ``/v2/health/ready``, gRPC
``ServerLive`` / ``ServerReady``), for probes.  Everything else, model readiness included (it tells
whether a model exists), needs a key: without one, or with a wrong one, HTTP answers 401 with
``WWW-Authenticate: Bearer`` (RFC 6750; ``error="invalid_token"`` when a token was given) and gRPC
UNAUTHENTICATED, the same words whatever the path or model, so nothing about models shows.

A key with an allow-list sees only its models: any other is answered exactly as an unknown model
(``hidden``: Triton's "unknown model" words, 404 / NOT_FOUND; gRPC ModelReady ``ready=false``), the
statistics and the repository index list only its models (``visible``), and repository load/unload
needs a key without an allow-list (PERMISSION_DENIED, whatever the model).
"""
from __future__ import annotations

import json

from aieng.gateway.apikeys import Grant
from aieng.gateway.models import unknown_model
from aieng.wire import protocol as p

OPEN_HTTP = (["v2", "health", "live"], ["v2", "health", "ready"])
OPEN_GRPC = frozenset({"ServerLive", "ServerReady"})
REFUSED = "a valid API key is needed: Authorization: Bearer <key>"
_BODY = json.dumps({"error": REFUSED}).encode()


def unauthorized(token_given: bool) -> tuple[int, dict, bytes]:
    """The HTTP answer to a request without a valid key."""
    challenge = 'Bearer realm="aieng", error="invalid_token"' if token_given else 'Bearer realm="aieng"'
    return 401, {"Content-Type": "application/json", "WWW-Authenticate": challenge}, _BODY


def hidden(grant: Grant | None, name: str, version: str | None) -> None:
    """MODEL_NOT_FOUND in an unknown model's words when ``grant``'s allow-list lacks ``name``."""
    if grant is not None and grant.models is not None and name not in grant.models:
        raise p.RequestError(p.MODEL_NOT_FOUND, unknown_model(name, version))


def http_model(parts: list[str]) -> tuple[str, str | None] | None:
    """The model (and version) an OIP REST path names, None for a path that names none."""
    if len(parts) < 3 or parts[:2] != ["v2", "models"] or parts[2:] == ["stats"]:
        return None
    version = parts[4] if parts[3:4] == ["versions"] and len(parts) >= 5 else None
    return parts[2], version


def visible(grant: Grant | None, entries: list[dict]) -> list[dict]:
    """The entries (each with a ``name``) of the models ``grant`` may see."""
    if grant is None or grant.models is None:
        return entries
    return [e for e in entries if e.get("name") in grant.models]


def may_change(grant: Grant | None, action: str) -> None:
    """Repository load/unload with a key that has an allow-list: PERMISSION_DENIED (whatever the model)."""
    if grant is not None and grant.models is not None:
        raise p.RequestError("PERMISSION_DENIED", f"repository {action} needs an API key without a model "
                                                  f"allow-list")
