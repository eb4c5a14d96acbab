"""Gray release end to end: sticky weighted routing, rules, rollback, auto-rollback, persistence, admin CLI.

Every test runs the real server on a model repository of its own (tmp): two versions of the demo
``tabular`` model (the same files, distinct metadata, so distinct content hashes), and for the
auto-rollback test a tiny ``flaky`` model whose version 2 fails on odd-sized inputs.  Admin changes go
through ``python -m aieng.cli rollout ...`` (the command line a user runs) against the admin socket.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request

import msgpack
import numpy as np
import pytest
import zmq

from aieng.frontend.rollout import routing
from aieng.frontend.rollout.routestore import store_path
from tests.conftest import free_port
from tests.e2e.rollout_helpers import PENGUIN, cli, infer_many, metric, start, status, tabular_repo
from tests.waits import until

pytestmark = pytest.mark.e2e

KEYS = [f"user-{i}" for i in range(10_000)]


def flaky_repo(repo, routing_yaml: str) -> None:
    """``flaky``: version 1 is the identity; version 2 reshapes to [-1, 2], so an odd-sized input fails
    in ONNX Runtime (INTERNAL) while warm-up (even sizes) passes."""
    import onnx
    from onnx import TensorProto, helper

    for v in ("1", "2"):
        shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 2 if v == "2" else 1])
        nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
                 helper.make_node("Identity", ["r"], ["y"])]
        graph = helper.make_graph(nodes, f"flaky{v}",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  initializer=[shape])
        d = repo / "flaky" / v
        d.mkdir(parents=True)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        onnx.save(model, str(d / "model.onnx"))
        (d / "model.yaml").write_text(
            "inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
            "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
            "batching: {max_batch_size: 1, max_wait_ms: 0}\n")
    (repo / "flaky" / "model.yaml").write_text(routing_yaml)


def versions_of(replies: dict) -> dict:
    assert all(r["ok"] for r in replies.values()), next(r for r in replies.values() if not r["ok"])
    return {k: r["version"] for k, r in replies.items()}


def test_sticky_weights_share_and_a_canary_raise_moves_only_what_it_must(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 95, '2': 5}\n")
    srv = start(make_server, tmp_path, repo)
    t0 = time.monotonic()
    before = versions_of(infer_many(srv, KEYS, PENGUIN))
    took = time.monotonic() - t0
    print(f"{len(KEYS)} tabular requests, 64 in flight: {took:.1f}s ({len(KEYS) / took:.0f}/s)")
    share2 = sum(v == "2" for v in before.values()) / len(KEYS) * 100
    assert abs(share2 - 5) <= 2, share2
    # the server routes exactly as the pure logic says, key by key
    s95 = routing.build(None, {"1", "2"}, {"1": 95, "2": 5})
    assert before == {k: s95.decide(k, "", None, {}, {})[0] for k in KEYS}
    # sticky: the same keys again land where they did
    again = versions_of(infer_many(srv, KEYS[:2000], PENGUIN))
    assert again == {k: before[k] for k in KEYS[:2000]}

    code, out, err = cli(srv, "rollout", "set-weights", "tabular", "1=90", "2=10")
    assert code == 0, err
    assert json.loads(out)["moved_buckets"] == 500
    after = versions_of(infer_many(srv, KEYS, PENGUIN))
    moved = [(before[k], after[k]) for k in KEYS if before[k] != after[k]]
    assert set(moved) == {("1", "2")}  # only old -> new, nothing else moves
    s90 = routing.build(s95, {"1", "2"}, {"1": 90, "2": 10})
    assert after == {k: s90.decide(k, "", None, {}, {})[0] for k in KEYS}
    assert abs(sum(v == "2" for v in after.values()) / len(KEYS) * 100 - 10) <= 2
    st = status(srv, "tabular")
    assert st["weights"] == {"1": 90.0, "2": 10.0} and st["ranges"]["2"] == [[9000, 10000]]


RULES = """
groups: {beta: [alice, bob]}
rules:
  - {name: beta, group: beta, version: "2"}
  - {name: heavy, when: {input: body_mass_g, op: ">", value: 5000}, version: "2"}
  - {name: top3, when: {param: top_k, op: "==", value: 3}, version: "2"}
"""


def test_rules_pinned_versions_and_metadata(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 100}\n")
    srv = start(make_server, tmp_path, repo)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    code, out, err = cli(srv, "rollout", "set-rules", "tabular", str(rules))
    assert code == 0, err
    with srv.client() as c:
        def ask(**fields) -> dict:
            req = {"op": "infer", "id": 1, "model": "tabular", "inputs": dict(PENGUIN)}
            req["inputs"].update(fields.pop("inputs", {}))
            req.update(fields)
            return c.call(req, raise_on_error=False)

        got = {name: (r.get("version"), r.get("route")) for name, r in {
            "group": ask(routing_key="alice"), "outsider": ask(routing_key="carol"),
            "feature": ask(routing_key="carol", inputs={"body_mass_g": 5500.0}),
            "param": ask(params={"top_k": 3}), "pinned": ask(version="2"),
            "pinned_but_group": ask(version="1", routing_key="bob"),
        }.items()}
        assert got == {"group": ("2", "rule:beta"), "outsider": ("1", "weight"),
                       "feature": ("2", "rule:heavy"), "param": ("2", "rule:top3"),
                       "pinned": ("2", "pinned"), "pinned_but_group": ("2", "rule:beta")}
        # a version by content hash: the full sha256 or a unique prefix of >= 12 hex digits
        models = c.models()["models"]["tabular"]
        h2 = models["versions"]["2"]["hash"]
        assert models["versions"]["2"]["metadata"] == {
            "created": "2026-11-02", "training_data": "penguins-seed-2", "metrics": {"accuracy": 0.92},
            "notes": "version 2"}
        by_prefix, by_hash = ask(version="sha256:" + h2[:12]), ask(version="sha256:" + h2)
        assert (by_prefix["version"], by_hash["version"], by_hash["route"]) == ("2", "2", "pinned")
        short = ask(version="sha256:" + h2[:8])
        assert (short["ok"], short["error"]["code"]) == (False, "INVALID_REQUEST")
        assert ask(routing_key="x" * 257)["error"]["code"] == "INVALID_REQUEST"
    code, out, err = cli(srv, "models", "list")
    assert code == 0, err
    listed = json.loads(out)["models"]["tabular"]["versions"]
    assert listed["1"]["metadata"]["training_data"] == "penguins-seed-1" and listed["2"]["hash"] == h2
    # pinning refused for this model: a request naming a version is INVALID_REQUEST, others still serve
    rules.write_text(RULES + "allow_pinned: false\n")
    assert cli(srv, "rollout", "set-rules", "tabular", str(rules))[0] == 0
    with srv.client() as c:
        refused = c.call({"id": 2, "model": "tabular", "inputs": PENGUIN, "version": "1"},
                         raise_on_error=False)
        assert refused["error"]["code"] == "INVALID_REQUEST" and "allow_pinned" in refused["error"]["message"]
        assert c.call({"id": 3, "model": "tabular", "inputs": PENGUIN})["route"] == "weight"
    deadline = time.monotonic() + 5  # /debug serves the snapshot the loop publishes every 0.5 s
    while time.monotonic() < deadline:
        debug = json.loads(urllib.request.urlopen(srv.http + "/debug", timeout=10).read())
        if debug["routing"]["tabular"]["allow_pinned"] is False:
            break
        time.sleep(0.1)
    assert debug["routing"]["tabular"]["allow_pinned"] is False
    assert debug["models"]["tabular"]["2"]["metadata"]["notes"] == "version 2"


def test_rollback_is_a_pointer_flip(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 100}\n")
    srv = start(make_server, tmp_path, repo)
    assert cli(srv, "rollout", "promote", "tabular", "2")[0] == 0
    executor = srv.child_pid("aieng::executor")
    ctx = zmq.Context.instance()
    admin = ctx.socket(zmq.DEALER)
    admin.setsockopt(zmq.LINGER, 0)
    admin.connect(srv.admin)
    try:
        with srv.client() as c:
            first = c.call({"id": 0, "model": "tabular", "inputs": PENGUIN, "routing_key": "k"})
            assert first["version"] == "2"
            t0 = time.monotonic()
            admin.send(msgpack.packb({"op": "rollback", "model": "tabular", "id": 1}))
            n, first_old = 0, None
            while first_old is None and n < 1000:  # back-to-back requests until one is routed the old way
                n += 1
                r = c.call({"id": n, "model": "tabular", "inputs": PENGUIN, "routing_key": "k"})
                if r["version"] == "1":
                    first_old = time.monotonic() - t0
            assert admin.poll(10_000)
            reply = msgpack.unpackb(admin.recv(), raw=False)
    finally:
        admin.close(0)
    assert reply["ok"] and reply["routing"]["weights"] == {"1": 100.0}, reply
    assert first_old is not None
    print(f"rollback: first request routed the old way answered {first_old * 1000:.1f} ms after the call")
    assert srv.child_pid("aieng::executor") == executor  # nothing was loaded or restarted
    st = status(srv, "tabular")
    assert st["reason"] == "model.yaml" and st["weights"] == {"1": 100.0}
    code, out, err = cli(srv, "rollout", "rollback", "tabular")  # nothing older: refused, nothing changes
    assert code == 1 and "no previous routing" in err
    assert status(srv, "tabular")["weights"] == {"1": 100.0}


AUTO = """routing:
  weights: {'1': 50, '2': 50}
  auto_rollback: {max_error_rate_delta: 0.2, max_p99_ratio: 50, window_s: 30, min_requests: 10}
"""


def test_auto_rollback_of_a_failing_canary(make_server, tmp_path):
    repo = tmp_path / "repo"
    flaky_repo(repo, AUTO)
    srv = start(make_server, tmp_path, repo, AIENG_BREAKER_FAILURES="0")
    odd = {"x": np.ones(3, dtype=np.float32)}  # version 2 fails on it, version 1 answers
    keys = [f"k{i}" for i in range(200)]
    state = routing.build(None, {"1", "2"}, {"1": 50, "2": 50})
    canary_keys = [k for k in keys if state.decide(k, "", None, {}, {})[0] == "2"]
    first = infer_many(srv, keys[:60], odd, model="flaky", in_flight=4)
    assert {r["error"]["code"] for k, r in first.items() if k in canary_keys} == {"INTERNAL"}
    assert all(r["ok"] and r["version"] == "1" for k, r in first.items() if k not in canary_keys)
    deadline = time.monotonic() + 10  # the frontend checks twice a second
    while time.monotonic() < deadline and status(srv, "flaky")["weights"]["2"] != 0:
        time.sleep(0.2)
    st = status(srv, "flaky")
    assert st["weights"] == {"1": 100.0, "2": 0.0}
    event = st["events"][-1]
    assert event["kind"] == "auto_rollback" and event["version"] == "2" and "error rate" in event["reason"]
    assert st["reason"].startswith("auto-rollback of 2")
    # the canary's keys now go to version 1 and succeed
    again = infer_many(srv, canary_keys, odd, model="flaky", in_flight=4)
    assert {(r["ok"], r["version"], r["route"]) for r in again.values()} == {(True, "1", "weight")}
    assert metric(srv, "aieng_rollout_auto_rollbacks_total", model="flaky", version="2") == 1.0
    assert "auto-rollback of flaky:2" in srv.output()
    code, out, err = cli(srv, "rollout", "status", "flaky")
    assert code == 0 and "auto_rollback" in out and "error rate" in out, out + err
    # it is written (off the loop: a bounded wait), and a restart keeps it: the bad canary gets no traffic
    # back (issue 20, finding 12)
    path = store_path(str(tmp_path / "state"), str(repo))

    def saved_weights() -> dict:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)["models"]["flaky"]["current"]["weights"]

    assert until(lambda: saved_weights() == {"1": 100.0, "2": 0.0}, 10), saved_weights()
    assert srv.stop() == 0
    again = start(make_server, tmp_path, repo, AIENG_BREAKER_FAILURES="0")
    st = status(again, "flaky")
    assert st["weights"] == {"1": 100.0, "2": 0.0} and st["events"][-1]["kind"] == "auto_rollback"
    after = infer_many(again, canary_keys, odd, model="flaky", in_flight=4)
    assert {(r["ok"], r["version"]) for r in after.values()} == {(True, "1")}


def test_routing_survives_a_restart_and_sighup_reloads_model_yaml(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 95, '2': 5}\n")
    srv = start(make_server, tmp_path, repo)
    assert cli(srv, "rollout", "set-weights", "tabular", "1=80", "2=20")[0] == 0
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    assert cli(srv, "rollout", "set-rules", "tabular", str(rules))[0] == 0
    before = status(srv, "tabular")
    keys = KEYS[:1000]
    routed = versions_of(infer_many(srv, keys, PENGUIN))
    assert srv.stop() == 0

    srv2 = start(make_server, tmp_path, repo)
    after = status(srv2, "tabular")
    for field in ("weights", "ranges", "rules", "groups", "allow_pinned"):
        assert after[field] == before[field], field
    assert versions_of(infer_many(srv2, keys, PENGUIN)) == routed
    assert after["history"] == before["history"]  # rollback still reaches the routing before the restart

    # systemd reload: editing model.yaml then SIGHUP makes model.yaml win; RELOADING=1 then READY=1
    (repo / "tabular" / "model.yaml").write_text("routing:\n  weights: {'1': 30, '2': 70}\n")
    notify = tmp_path / "notify.sock"
    assert srv2.stop() == 0
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(0.5)
    try:
        srv3 = start(make_server, tmp_path, repo, NOTIFY_SOCKET=str(notify))
        assert status(srv3, "tabular")["weights"] == {"1": 30.0, "2": 70.0}  # model.yaml changed: it wins
        (repo / "tabular" / "model.yaml").write_text("routing:\n  weights: {'1': 60, '2': 40}\n")
        got: list[str] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # what startup sent
            try:
                got.append(sock.recv(4096).decode())
            except socket.timeout:
                break
        assert any("READY=1" in g for g in got)
        got.clear()
        os.kill(srv3.pid, signal.SIGHUP)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any("READY=1" in g for g in got):
            try:
                got.append(sock.recv(4096).decode())
            except socket.timeout:
                pass
    finally:
        sock.close()
    reloading = next(i for i, g in enumerate(got) if "RELOADING=1" in g)
    ready = next(i for i, g in enumerate(got) if "READY=1" in g)
    assert reloading < ready and "changed: tabular" in got[ready], got
    st = status(srv3, "tabular")
    assert st["weights"] == {"1": 60.0, "2": 40.0} and st["reason"] == "model.yaml"
    assert st["events"][-1]["kind"] == "reload"


def test_bad_admin_input_is_refused_and_changes_nothing(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 90, '2': 10}\n")
    srv = start(make_server, tmp_path, repo)
    assert cli(srv, "rollout", "set-weights", "tabular", "1=80", "2=20")[0] == 0
    saved = tmp_path / "state"
    files = {p.name: p.read_bytes() for p in saved.iterdir()}
    before = status(srv, "tabular")
    bad_rule = tmp_path / "bad.yaml"
    bad_rule.write_text("rules:\n  - {name: x, when: {param: a, op: '~', value: 1}, version: '2'}\n")
    cases = {
        ("rollout", "set-weights", "nosuch", "1=100"): "unknown model 'nosuch'",
        ("rollout", "set-weights", "tabular", "1=50", "7=50"): "unknown version '7'",
        ("rollout", "set-weights", "tabular", "1=50", "2=40"): "must sum to 100, they sum to 90",
        ("rollout", "set-rules", "tabular", str(bad_rule)): "op must be one of",
        ("rollout", "promote", "tabular", "9"): "has no version '9'",
    }
    for args, why in cases.items():
        code, out, err = cli(srv, *args)
        assert (code, why in err) == (1, True), (args, err)
    after = status(srv, "tabular")
    assert {k: after[k] for k in ("weights", "ranges", "rules", "history")} == \
        {k: before[k] for k in ("weights", "ranges", "rules", "history")}
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == files
    # admin ops are not served on the client socket
    with srv.client() as c:
        for op in ("set_weights", "rollback", "status"):
            r = c.call({"op": op, "id": op, "model": "tabular", "weights": {"2": 100}}, raise_on_error=False)
            assert r["error"]["code"] == "INVALID_REQUEST" and "unknown op" in r["error"]["message"]
    assert status(srv, "tabular")["weights"] == {"1": 80.0, "2": 20.0}


def test_admin_curve_has_its_own_allowed_keys(make_server, tmp_path):
    import zmq.auth

    dirs = {n: tmp_path / n for n in ("server", "clients", "admins", "other")}
    for d in dirs.values():
        d.mkdir()
    server_pub, server_secret = zmq.auth.create_certificates(str(dirs["server"]), "server")
    _, client_secret = zmq.auth.create_certificates(str(dirs["clients"]), "client")
    _, admin_secret = zmq.auth.create_certificates(str(dirs["admins"]), "admin")
    s_pub, _ = zmq.auth.load_certificate(server_pub)
    c_pub, c_sec = zmq.auth.load_certificate(client_secret)
    admin_addr = f"tcp://127.0.0.1:{free_port()}"
    srv = make_server(AIENG_MODELS="tabular", AIENG_STATE_DIR=str(tmp_path / "state"),
                      AIENG_CURVE_SECRET_KEY_FILE=server_secret,
                      AIENG_CURVE_CLIENT_KEYS_DIR=str(dirs["clients"]),
                      AIENG_ADMIN_ADDR=admin_addr, AIENG_ADMIN_CURVE_SECRET_KEY_FILE=server_secret,
                      AIENG_ADMIN_CURVE_CLIENT_KEYS_DIR=str(dirs["admins"]))
    srv.curve = (c_pub, c_sec, s_pub)
    srv.admin = admin_addr
    srv.start()

    def as_(secret: str) -> tuple[int, str, str]:
        return cli(srv, "rollout", "status", "tabular", "--timeout", "3", "--json",
                   "--curve-client-cert", secret, "--curve-server-cert", server_pub)

    code, out, err = as_(admin_secret)
    assert code == 0 and json.loads(out)["models"]["tabular"]["weights"] == {"1": 100.0}, err
    code, out, err = as_(client_secret)  # a client key does not open the admin socket
    assert code == 2 and "no answer" in err
    code, out, err = cli(srv, "rollout", "status", "--timeout", "3")  # nor does plaintext
    assert code == 2
    a_pub, a_sec = zmq.auth.load_certificate(admin_secret)
    with srv.client(timeout_s=3, dealer=True, curve=(a_pub, a_sec, s_pub)) as c:
        with pytest.raises(TimeoutError):
            c.health()  # and an admin key does not open the client socket


def test_routing_to_a_version_that_failed_to_load_is_refused(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 100}\n")
    (repo / "tabular" / "2" / "model.onnx").write_bytes(b"not an onnx file")
    srv = start(make_server, tmp_path, repo, AIENG_STRICT_MODEL_LOAD="0")
    deadline = time.monotonic() + 10  # the executor's hello names the failed version
    while time.monotonic() < deadline and not srv.health().get("failed_models"):
        time.sleep(0.2)
    assert "tabular:2" in srv.health()["failed_models"]
    code, out, err = cli(srv, "rollout", "set-weights", "tabular", "1=90", "2=10")
    assert code == 1 and "version 2 of 'tabular' is not loaded" in err
    assert status(srv, "tabular")["weights"] == {"1": 100.0}
    with srv.client() as c:
        assert c.call({"id": 1, "model": "tabular", "inputs": PENGUIN})["version"] == "1"
