"""The native door's per-client limits count per CURVE key (issue 37), against the real server.

With CURVE on, a client is its public key: two connections with one key share one share, and another key
from the same address keeps its own.  Shown with the op rate limit (``AIENG_MAX_OPS_PER_S=1``: one health op
a second per client, a one-second burst): key A's first connection takes A's op, A's second connection is
refused at once (before, each connection was a client of its own), and key B, from the same address, is
answered.  Readiness is asked with a third key, so it takes nothing of A's or B's.
"""
from __future__ import annotations

import pytest
import zmq
import zmq.auth

from aieng.client import Client

pytestmark = pytest.mark.e2e


def test_one_key_is_one_client_over_two_connections_and_two_keys_are_two(make_server, tmp_path):
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub_file, server_secret_file = zmq.auth.create_certificates(str(keys), "server")
    s_pub, _ = zmq.auth.load_certificate(server_pub_file)
    pairs = {}
    for name in ("a", "b", "probe"):
        _, secret_file = zmq.auth.create_certificates(str(allowed), name)
        pairs[name] = (*zmq.auth.load_certificate(secret_file), s_pub)
    srv = make_server(AIENG_MODELS="tabular", AIENG_CURVE_SECRET_KEY_FILE=server_secret_file,
                      AIENG_CURVE_CLIENT_KEYS_DIR=str(allowed), AIENG_MAX_OPS_PER_S="1")
    srv.curve = pairs["probe"]
    srv.start()
    a1 = Client(srv.addr, timeout_s=10, dealer=True, curve=pairs["a"])
    a2 = Client(srv.addr, timeout_s=10, dealer=True, curve=pairs["a"])
    b = Client(srv.addr, timeout_s=10, dealer=True, curve=pairs["b"])
    try:
        for c in (a1, a2, b):  # connected and handshaken before the one-second window starts
            c.infer("tabular", {"island": "Dream"})
        first = a1.call({"op": "health", "id": "a1"}, raise_on_error=False)
        second = a2.call({"op": "health", "id": "a2"}, raise_on_error=False)
        other = b.call({"op": "health", "id": "b"}, raise_on_error=False)
    finally:
        for c in (a1, a2, b):
            c.close()
    assert (first["ok"], other["ok"]) == (True, True)
    assert (second["ok"], second["error"]["code"]) == (False, "OVERLOADED")
    assert second["error"]["message"] == "over this client's limit of 1 health/models/stats messages/s"
