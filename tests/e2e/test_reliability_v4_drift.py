"""Drift cannot be blinded by one client, and a corrupt drift file cannot stop the start (issue 33).

One client sending ``hello`` 200 times, over several connections from one address, does not become minilm's
reference: the reference stays ``collecting`` with 1 client of the 4 needed and that client's share taken
(AIENG_DRIFT_REFERENCE_N=40, _CLIENTS=4: at most 10 answers each; the span rule is off here, it has unit
tests), nor does it when its requests name another peer as only a gateway may.  Two more native clients
(other loopback addresses) and one OIP client (its address carried by the gateway) complete it.  Then five
corrupt ``drift-*.json`` files, each in the state dir of a fresh start: the server starts, serves, logs why
the file or reference was dropped, and collects tabular's reference again.
"""
from __future__ import annotations

import http.client
import json
import os

import msgpack
import pytest
import zmq

from aieng.client import build_request
from aieng.frontend.observe.driftstore import drift_path
from aieng.models.repo import load_spec
from tests.conftest import MODELS
from tests.waits import until

pytestmark = pytest.mark.e2e

ENGLISH = ["The man walked in the park today.", "A small dog sat near the red car.",
           "Yesterday the woman saw a big blue house.", "The cat ran on the street this morning.",
           "In the evening a man talked near the house."]


def oip_all(srv, source: str, texts: list[str]) -> list[int]:
    """Each text as one OIP HTTP request for minilm from ``source``; the statuses."""
    host, port = srv.oip_http.split(":")
    statuses = []
    for text in texts:
        conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0))
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
        conn.request("POST", "/v2/models/minilm/infer", json.dumps(body),
                     {"Content-Type": "application/json"})
        statuses.append(conn.getresponse().status)
        conn.close()
    return statuses


def send_all(srv, source: str, texts: list[str], connections: int = 1, **fields) -> list[dict]:
    """Each text as one minilm request from ``source`` (a loopback address) over ``connections``
    connections in turn; the replies, matched to their ids."""
    ctx = zmq.Context.instance()
    socks = []
    for _ in range(connections):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{source}:0;127.0.0.1:{srv.port}")
        socks.append(s)
    try:
        replies = {}
        for i, text in enumerate(texts):
            sock = socks[i % connections]
            req = dict(build_request(i, "minilm", {"text": text}), **fields)
            sock.send_multipart([b"", msgpack.packb(req)])
            assert sock.poll(30_000), f"no answer to request {i} from {source}"
            reply = msgpack.unpackb(sock.recv_multipart()[-1], raw=False)
            replies[reply["id"]] = reply
        return [replies[i] for i in range(len(texts))]
    finally:
        for s in socks:
            s.close(0)


def reference(srv, model: str, version: str) -> dict:
    with srv.client() as c:
        return c.models()["drift"][model][version]["reference"]


def test_one_clients_hellos_do_not_become_the_reference(make_server):
    srv = make_server(AIENG_MODELS="minilm", AIENG_DRIFT_REFERENCE_N="40", AIENG_DRIFT_REFERENCE_CLIENTS="4",
                      AIENG_DRIFT_REFERENCE_SPAN_S="0", AIENG_DRIFT_WINDOW="40").start()
    hellos = send_all(srv, "127.0.0.2", ["hello"] * 200, connections=5)
    assert all(r["ok"] for r in hellos), next(r for r in hellos if not r["ok"])
    version = hellos[0]["version"]
    ref = reference(srv, "minilm", version)
    got = (ref["state"], ref["collected"], ref["clients"], ref["clients_needed"])
    assert got == ("collecting", 10, 1, 4), ref  # one address, five connections: one client, its share
    # naming another peer as a gateway would, without the gateways' secret, changes nothing
    forged = send_all(srv, "127.0.0.2", ["hello"] * 10, via={"token": "guess", "peer": "10.9.9.9"})
    assert all(r["ok"] for r in forged)
    assert reference(srv, "minilm", version)["clients"] == 1
    for i, source in enumerate(("127.0.0.3", "127.0.0.4")):
        replies = send_all(srv, source, [ENGLISH[(i + k) % 5] for k in range(20)])
        assert all(r["ok"] for r in replies)
    ref = reference(srv, "minilm", version)
    assert (ref["state"], ref["collected"], ref["clients"]) == ("collecting", 30, 3), ref
    # an OIP client counts as its own address, not as the gateway's connection
    assert oip_all(srv, "127.0.0.6", ENGLISH * 2) == [200] * 10
    assert until(lambda: reference(srv, "minilm", version)["state"] == "ready", 10), \
        reference(srv, "minilm", version)
    ref = reference(srv, "minilm", version)
    assert (ref["collected"], ref["clients"]) == (40, 4), ref
    built = [line for line in srv.output().splitlines() if "drift reference of minilm" in line]
    assert any("of 4 clients" in line for line in built), built


def tabular_hash() -> str:
    return load_spec("tabular", "1", os.path.join(MODELS, "tabular", "1")).content_hash


def saved(built: dict) -> str:
    good = {"digest": tabular_hash(), "size": 200, "inputs": {}, "outputs": {}}
    return json.dumps({"format": 1, "references": {"tabular:1": dict(good, **built)}})


CORRUPT = {
    "bad_json": lambda: '{"format": 1, "references": {',
    "deep": lambda: '{"format": 1, "references": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "wrong_types": lambda: saved({"size": [200]}),
    "bad_values": lambda: saved({"outputs": {"confidence": {"edges": [0.5], "proportions": ["x", "y"]}}}),
    "wrong_shapes": lambda: saved({"inputs": "island"}),
}


@pytest.mark.parametrize("variant", sorted(CORRUPT))
def test_a_corrupt_drift_file_is_logged_and_ignored(make_server, tmp_path, variant):
    state = tmp_path / "state"
    state.mkdir()
    path = drift_path(str(state), MODELS)
    with open(path, "w") as fh:
        fh.write(CORRUPT[variant]())
    srv = make_server(AIENG_MODELS="tabular", AIENG_STATE_DIR=str(state), AIENG_PREPROCESS_WORKERS="1")
    srv.start()
    with srv.client() as c:
        reply = c.infer("tabular", {"island": "Biscoe", "bill_length_mm": 45.1, "body_mass_g": 4000.0})
        assert reply["ok"] is True
    assert reference(srv, "tabular", "1")["state"] == "collecting"
    logged = [line for line in srv.output().splitlines()
              if "drift reference" in line and "collecting" in line]
    assert len(logged) >= 1, srv.output()[-3000:]
    assert os.path.basename(path) in logged[0], logged
