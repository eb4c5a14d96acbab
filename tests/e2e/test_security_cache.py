"""ZMQ CURVE on the client socket (an unknown client key is refused) and the optional
response cache (hits marked cached, errors never cached, budget respected)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
import zmq.auth

from aieng.client import Client

pytestmark = pytest.mark.e2e


def test_curve_refuses_unknown_client_keys(make_server, tmp_path):
    keys, allowed, other = tmp_path / "keys", tmp_path / "allowed", tmp_path / "other"
    for d in (keys, allowed, other):
        d.mkdir()
    server_pub, server_secret_file = zmq.auth.create_certificates(str(keys), "server")
    client_pub_file, client_secret_file = zmq.auth.create_certificates(str(allowed), "client")
    _, stranger_secret_file = zmq.auth.create_certificates(str(other), "stranger")
    srv = make_server(AIENG_MODELS="tabular", AIENG_CURVE_SECRET_KEY_FILE=server_secret_file,
                      AIENG_CURVE_CLIENT_KEYS_DIR=str(allowed))
    srv.start(wait=False)
    s_pub, _ = zmq.auth.load_certificate(server_pub)
    c_pub, c_sec = zmq.auth.load_certificate(client_secret_file)
    x_pub, x_sec = zmq.auth.load_certificate(stranger_secret_file)

    deadline = time.monotonic() + 90
    h = None
    while time.monotonic() < deadline and not (h and h.get("ready")):
        with Client(srv.addr, timeout_s=1.0, dealer=True, curve=(c_pub, c_sec, s_pub)) as c:
            try:
                h = c.health()
            except TimeoutError:
                h = None
    assert h and h["ready"], srv.output()
    with Client(srv.addr, timeout_s=10, curve=(c_pub, c_sec, s_pub)) as c:
        out = c.infer("tabular", {"island": "Dream"})["outputs"]
        assert out["label"] in ("Adelie", "Chinstrap", "Gentoo")
    with Client(srv.addr, timeout_s=2, dealer=True, curve=(x_pub, x_sec, s_pub)) as c:
        with pytest.raises(TimeoutError):
            c.health()  # the handshake is refused: nothing comes back
    with Client(srv.addr, timeout_s=2, dealer=True) as c:
        with pytest.raises(TimeoutError):
            c.health()  # plaintext is not spoken
    assert "CURVE" in srv.output()


def test_response_cache(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_CACHE_BYTES="100000").start()
    row = {"island": "Biscoe", "bill_length_mm": 47.0}
    with srv.client() as c:
        first = c.infer("tabular", row)
        second = c.infer("tabular", row)
        assert "cached" not in first and second["cached"] is True
        np.testing.assert_array_equal(first["outputs"]["probabilities"], second["outputs"]["probabilities"])
        assert first["outputs"]["label"] == second["outputs"]["label"]
        assert "cached" not in c.infer("tabular", dict(row, bill_length_mm=48.0))  # other input: a miss
        for _ in range(2):  # errors are never cached
            bad = c.infer("tabular", {"island": 3}, raise_on_error=False)
            assert bad["ok"] is False and "cached" not in bad
        view = c.health()["cache"]
        assert view["hits"] == 1 and view["entries"] == 2 and view["bytes"] <= view["budget"]
