"""ZMQ CURVE on the client socket (an unknown client key is refused) and the optional
response cache (hits marked cached, errors never cached, the byte budget kept by evicting the
least recently used answer)."""
from __future__ import annotations

import json
import re
import urllib.request

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
    s_pub, _ = zmq.auth.load_certificate(server_pub)
    c_pub, c_sec = zmq.auth.load_certificate(client_secret_file)
    x_pub, x_sec = zmq.auth.load_certificate(stranger_secret_file)
    srv.curve = (c_pub, c_sec, s_pub)  # readiness is asked with an allowed key
    srv.start()
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
    # the OIP gateway is a client of the same socket: its own per-instance key is admitted beside the dir's
    body = json.dumps({"inputs": [{"name": "island", "datatype": "BYTES", "shape": [1], "data": ["Dream"]}]})
    req = urllib.request.Request(f"http://{srv.oip_http}/v2/models/tabular/infer", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(req, timeout=10).read())
    label = next(o for o in reply["outputs"] if o["name"] == "label")
    assert label["data"][0] in ("Adelie", "Chinstrap", "Gentoo")


BUDGET = 1000  # bytes: room for a handful of tabular answers (about 100 bytes each), see below


def cache_hits_metric(srv) -> float:
    text = urllib.request.urlopen(srv.http + "/metrics", timeout=5).read().decode()
    hit = re.search(r'^aieng_cache_hits_total\{model="tabular"\} ([0-9.e+]+)$', text, re.M)
    assert hit, "aieng_cache_hits_total for tabular is not exported"
    return float(hit.group(1))


def test_response_cache(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_CACHE_BYTES=str(BUDGET)).start()
    row = {"island": "Biscoe", "bill_length_mm": 47.0}
    with srv.client() as c:
        first = c.infer("tabular", row)
        entry = c.health()["cache"]["bytes"]  # the real size of one cached answer (key + packed outputs)
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
        check_lru_eviction(srv, c, row, dict(row, bill_length_mm=48.0), first["outputs"]["label"], entry)


def check_lru_eviction(srv, c, row: dict, other: dict, label: str, entry: int) -> None:
    """Fill the cache to its budget, refresh ``row``, add one more: ``other``, now the least
    recently used, is evicted and everything else is kept."""
    # Inputs near ``row`` give the same label, so every answer packs to the same size and the
    # budget holds exactly ``capacity`` of them.
    capacity = BUDGET // entry
    assert 3 <= capacity <= 20, (entry, capacity)  # the test needs a few entries, and stays short
    assert c.health()["cache"]["bytes"] == 2 * entry  # row and other, the same size
    fresh = [dict(row, bill_length_mm=47.0 + 0.01 * (i + 1)) for i in range(capacity - 1)]
    for inputs in fresh[:-1]:  # fill up: capacity entries in all
        reply = c.infer("tabular", inputs)
        assert "cached" not in reply and reply["outputs"]["label"] == label, reply
    view = c.health()["cache"]
    assert view["entries"] == capacity and view["bytes"] == capacity * entry <= BUDGET, view
    assert c.infer("tabular", row).get("cached") is True  # row is now the most recently used
    assert "cached" not in c.infer("tabular", fresh[-1])  # one over the budget: one must go
    view = c.health()["cache"]
    assert view["entries"] == capacity and view["bytes"] == capacity * entry, view
    hits = view["hits"]
    for inputs in [row] + fresh:  # kept: each answered from the cache
        assert c.infer("tabular", inputs).get("cached") is True, inputs
    after = c.health()["cache"]
    assert after["hits"] == hits + capacity, after
    evicted = c.infer("tabular", other)  # evicted: computed again, no hit counted
    assert "cached" not in evicted and evicted["outputs"]["label"] == label, evicted
    final = c.health()["cache"]
    assert final["hits"] == after["hits"] and final["misses"] == after["misses"] + 1, final
    assert cache_hits_metric(srv) == final["hits"]
