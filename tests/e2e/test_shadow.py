"""Shadow traffic end to end: mirrored copies compared and reported, primaries untouched, shed under load.

The real server on a tmp repository: ``tabular`` versions 1 and 2 (the demo model's files: identical answers,
so agreement 1.0, cosine 1.0, max abs diff 0) and ``plus`` versions 1 (y = x) and 2 (y = x + 0.5), so the max
abs diff is 0.5 and the cosine a known value.  Shadow traffic is turned on and off with
``python -m aieng.cli rollout shadow-on|shadow-off`` against the admin socket, as a user would.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from aieng.cli.rollout import call
from aieng.wire import protocol as p
from tests.e2e.rollout_helpers import PENGUIN, cli, infer_many, metric, start, tabular_repo

pytestmark = pytest.mark.e2e

X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)  # one row (the model's first dim is the batch)


def plus_repo(repo) -> None:
    """``plus``: version 1 is y = x, version 2 is y = x + 0.5 (tensor in, tensor out, no batching)."""
    import onnx
    from onnx import TensorProto, helper

    for v, add in (("1", 0.0), ("2", 0.5)):
        half = helper.make_tensor("c", TensorProto.FLOAT, [], [add])
        graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], f"plus{v}",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
                                  initializer=[half])
        d = repo / "plus" / v
        d.mkdir(parents=True)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                  str(d / "model.onnx"))
        (d / "model.yaml").write_text(
            "inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
            "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
            "batching: {max_batch_size: 1, max_wait_ms: 0}\n")
    (repo / "plus" / "model.yaml").write_text("routing:\n  weights: {'1': 100}\n")


def slow_repo(repo) -> None:
    """``slow``: version 1 is y = x; version 2 multiplies by a 1000 x 1000 matrix 60 times (tens of ms
    of inference), so a shadow copy with a 1 ms deadline always times out."""
    import onnx
    from onnx import TensorProto, helper

    for v in ("1", "2"):
        d = repo / "slow" / v
        d.mkdir(parents=True)
        if v == "1":
            nodes, init = [helper.make_node("Identity", ["x"], ["y"])], []
        else:
            w = np.eye(1000, dtype=np.float32)
            init = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.tobytes(), raw=True)]
            names = ["x"] + [f"h{i}" for i in range(59)] + ["y"]
            nodes = [helper.make_node("MatMul", [a, "w"], [b]) for a, b in zip(names, names[1:])]
        graph = helper.make_graph(nodes, f"slow{v}",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1000])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1000])],
                                  initializer=init)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                  str(d / "model.onnx"))
        (d / "model.yaml").write_text(
            "inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
            "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
            "batching: {max_batch_size: 1, max_wait_ms: 0}\n")
    (repo / "slow" / "model.yaml").write_text(
        "routing:\n  weights: {'1': 100}\n  shadow: {version: '2', percent: 100, timeout_ms: 1}\n")


def stats(srv) -> dict:
    with srv.client(timeout_s=10) as c:
        return c.call({"op": "stats", "id": 1})


def settled(srv, model: str, version: str, want: int, timeout_s: float = 20.0) -> dict:
    """The shadow tally once ``want`` copies have ended (compared or not) and nothing is in flight."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = stats(srv)
        tally = st["shadow"].get(model, {}).get(version)
        if tally is not None and sum(tally["outcomes"].values()) >= want and st["in_flight"] == 0:
            return tally
        assert time.monotonic() < deadline, f"shadow of {model}:{version} not settled: {st['shadow']}"
        time.sleep(0.05)


def timed(srv, reqs: list[dict]) -> tuple[list[dict], list[float]]:
    """The requests one after the other: the answers and each one's latency as the client saw it."""
    answers, took = [], []
    with srv.client(timeout_s=30) as c:
        for i, req in enumerate(reqs):
            t0 = time.perf_counter()
            answers.append(c.call(dict(req, id=i)))
            took.append(time.perf_counter() - t0)
    return answers, took


def penguins(n: int) -> list[dict]:
    """``n`` different tabular requests (different answers: a shadow compared with the wrong primary
    would show as disagreement even between identical versions)."""
    kinds = [("Torgersen", 38.0, 18.0, 190.0, 3700.0), ("Biscoe", 47.0, 15.0, 217.0, 5000.0),
             ("Dream", 49.0, 18.5, 196.0, 3700.0)]  # Adelie-, Gentoo- and Chinstrap-like
    out = []
    for i in range(n):
        island, bill, depth, flipper, mass = kinds[i % 3]
        out.append({"op": "infer", "model": "tabular", "inputs": {
            "island": island, "bill_length_mm": bill + 0.1 * i, "bill_depth_mm": depth,
            "flipper_length_mm": flipper, "body_mass_g": mass + i}})
    return out


def admin(srv, op: str, **fields) -> dict:
    reply = call(srv.admin, op, **fields)
    assert reply["ok"], reply
    return reply


def answer(reply: dict) -> dict:
    """A reply's outputs, comparable with ``==`` (the client decodes tensors to numpy arrays)."""
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in reply["outputs"].items()}


def pct(xs: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(xs, (50, 99))
    return float(p50), float(p99)


def test_shadow_pairs_are_compared_and_reported_and_primaries_are_untouched(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 100}\n")
    plus_repo(repo)
    # one request in flight per client: a copy in flight after its primary's answer must not count against it
    srv = start(make_server, tmp_path, repo, AIENG_MAX_INFLIGHT_PER_CLIENT="1")
    block, blocks = 50, 4
    reqs = penguins(block)
    plain, plain_s, shadowed, shadowed_s = [], [], [], []
    for _ in range(blocks):  # interleaved, so that a shared machine's drift hits both sides alike
        answers, took = timed(srv, reqs)
        plain += answers
        plain_s += took
        admin(srv, "shadow_on", model="tabular", version="2", percent=100)
        answers, took = timed(srv, reqs)
        shadowed += answers
        shadowed_s += took
        admin(srv, "shadow_off", model="tabular")
    n = block * blocks
    (a50, a99), (b50, b99) = pct(plain_s), pct(shadowed_s)
    print(f"tabular primary latency, {n} sequential requests a side: no shadow p50 {a50 * 1e3:.2f} ms "
          f"p99 {a99 * 1e3:.2f} ms; with 100% shadow p50 {b50 * 1e3:.2f} ms p99 {b99 * 1e3:.2f} ms")
    # no speed threshold in a test: the line above is the report of what the shadow costs the primaries

    # the primaries: the same answers as without a shadow, served by version 1 and routed by weight
    assert [(r["version"], r["route"]) for r in shadowed] == [("1", "weight")] * n
    assert [answer(r) for r in shadowed] == [answer(r) for r in plain]
    assert len({answer(r)["label"] for r in plain}) == 3  # answers differ: a mixed-up pair would disagree
    tally = settled(srv, "tabular", "2", n)
    assert tally["outcomes"] == {"compared": n, "shed": 0, "timeout": 0, "error": 0, "primary_failed": 0}
    got = (tally["pairs"], tally["label_pairs"], tally["agreement"], tally["max_abs_diff"])
    assert got == (n, n, 1.0, 0.0)
    assert tally["cosine_mean"] == pytest.approx(1.0, abs=1e-6)
    d50, d99 = tally["latency_delta_p50_s"] * 1e3, tally["latency_delta_p99_s"] * 1e3
    print(f"tabular 1 vs 2 shadow latency delta (shadow - primary): p50 {d50:+.2f} ms, p99 {d99:+.2f} ms")

    # the shadow pollutes none of the model's own numbers
    st = stats(srv)
    assert st["models"]["tabular"]["requests"] == 2 * n
    assert st["counts"]["requests"] == st["counts"]["ok"] == 2 * n
    assert metric(srv, "aieng_requests_total", model="tabular", version="2", code="OK") == 0.0
    assert metric(srv, "aieng_requests_total", model="tabular", version="1", code="OK") == 2 * n
    assert metric(srv, "aieng_shadow_requests_total", model="tabular", version="2", outcome="compared") == n
    assert metric(srv, "aieng_shadow_label_pairs_total", model="tabular", version="2", agree="true") == n
    assert metric(srv, "aieng_shadow_latency_delta_seconds_count", model="tabular", version="2") == n

    # a tensor model whose candidate differs by a known amount; on from the command line
    code, out, err = cli(srv, "rollout", "shadow-on", "plus", "2", "100")
    assert code == 0, err
    assert json.loads(out)["routing"]["shadow"] == {"version": "2", "percent": 100.0, "max_load": 0.5,
                                                    "timeout_ms": 0}
    req = {"op": "infer", "model": "plus", "inputs": {"x": p.encode_tensor(X)}}
    answers, _ = timed(srv, [req] * 30)
    assert [(r["version"], answer(r)["y"]) for r in answers] == [("1", X.tolist())] * 30
    plus = settled(srv, "plus", "2", 30)
    want_cos = float(X @ (X + 0.5) / (np.linalg.norm(X) * np.linalg.norm(X + 0.5)))
    assert (plus["pairs"], plus["label_pairs"], plus["agreement"], plus["max_abs_diff"]) == (30, 0, None, 0.5)
    assert plus["cosine_mean"] == pytest.approx(want_cos, abs=1e-6)

    code, out, err = cli(srv, "rollout", "status", "plus")
    assert code == 0, err
    assert "shadow: 100% to 2" in out
    assert f"shadow 2: 30 pairs compared, agreement -, mean cosine {want_cos:.6f}, max abs diff 0.5" in out

    # bad input changes nothing and says why
    code, _, err = cli(srv, "rollout", "shadow-on", "plus", "9", "100")
    assert code == 1
    assert "INVALID_REQUEST: shadow version '9' is not served" in err
    code, _, err = cli(srv, "rollout", "shadow-on", "plus", "2", "150")
    assert code == 1
    assert "shadow percent must be a number in 0..100" in err
    assert stats(srv)["shadow"]["plus"]["2"]["pairs"] == 30

    # shadow-off from the command line: no more copies
    code, out, err = cli(srv, "rollout", "shadow-off", "plus")
    assert code == 0, err
    assert json.loads(out)["routing"]["shadow"] is None
    timed(srv, [req] * 20)
    st = stats(srv)
    assert st["in_flight"] == 0
    assert st["shadow"]["plus"]["2"]["pairs"] == 30
    code, _, err = cli(srv, "rollout", "shadow-off", "plus")
    assert code == 1
    assert "has no shadow traffic to turn off" in err


def test_shadow_copies_are_shed_first_under_load(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 100}\n"
                       "  shadow: {version: '2', percent: 100, max_load: 0.05}\n")
    srv = start(make_server, tmp_path, repo, AIENG_MAX_INFLIGHT="64", AIENG_MAX_INFLIGHT_PER_CLIENT="64")
    n = 60  # near capacity at once; a shadow copy is made only while fewer than 0.05 x 64 are in flight
    replies = infer_many(srv, [f"user-{i}" for i in range(n)], PENGUIN, in_flight=n)
    assert [(r["ok"], r["version"]) for r in replies.values()] == [(True, "1")] * n
    tally = settled(srv, "tabular", "2", n)
    print(f"{n} requests at once, max_load 0.05 of 64: outcomes {tally['outcomes']}")
    assert sum(tally["outcomes"].values()) == n
    assert tally["shed"] >= 1
    assert tally["pairs"] == n - tally["shed"]
    shed = metric(srv, "aieng_shadow_requests_total", model="tabular", version="2", outcome="shed")
    assert shed == tally["shed"]


def test_a_shadow_past_its_own_deadline_times_out_and_frees_its_slot(make_server, tmp_path):
    repo = tmp_path / "repo"
    slow_repo(repo)
    # 8 slots per ring: 40 timed-out copies would exhaust them if a single slot leaked
    srv = start(make_server, tmp_path, repo, AIENG_SHM_SLOTS="8")
    x = np.arange(1000, dtype=np.float32)
    n = 40
    answers, _ = timed(srv, [{"op": "infer", "model": "slow", "inputs": {"x": p.encode_tensor(x)}}] * n)
    assert [(r["version"], answer(r)["y"]) for r in answers] == [("1", x.tolist())] * n
    tally = settled(srv, "slow", "2", n)
    assert tally["outcomes"] == {"compared": 0, "shed": 0, "timeout": n, "error": 0, "primary_failed": 0}
    st = stats(srv)
    assert (st["counts"]["requests"], st["counts"]["ok"], st["counts"]["errors"]) == (n, n, {})
    assert metric(srv, "aieng_requests_total", model="slow", version="2", code="TIMEOUT") == 0.0
    assert metric(srv, "aieng_shadow_requests_total", model="slow", version="2", outcome="timeout") == n
    # and the slots came back: more requests, each with its copy, all answered
    answers, _ = timed(srv, [{"op": "infer", "model": "slow", "inputs": {"x": p.encode_tensor(x)}}] * n)
    assert [r["ok"] for r in answers] == [True] * n
    assert settled(srv, "slow", "2", 2 * n)["outcomes"]["timeout"] == 2 * n
