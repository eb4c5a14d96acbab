"""Whose request this is: the one name every per-client budget of the OIP doors counts by.

``principal`` picks, strongest first: the API key's principal (``key:<name>``, ``apikeys.Grant``), the
TLS client certificate's subject (``cert:<subject>``; None until mutual TLS is on: the HTTP core's
``Peer.subject``, gRPC's ``tls_subject(context)``), else the client's address as ``httpcore.fair.peer_key``
counts it (an IPv6 address by its /64).  The gateway's row budget (``budget.PeerBudget``) and the
frontend's per-client limit (the name travels as the request's ``via`` peer) count by it, so two
principals behind one address (a proxy, a NAT) keep a share each and one principal with many connections
or addresses keeps one.  docs/oip.md, "Sharing".
"""
from __future__ import annotations

from aieng.gateway.apikeys import Grant
from aieng.httpcore.fair import peer_key


def principal(grant: Grant | None, subject: str | None, host: str) -> str:
    if grant is not None:
        return "key:" + grant.principal
    if subject:
        return "cert:" + subject
    return peer_key(host)
