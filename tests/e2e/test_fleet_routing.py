"""A fleet of two real servers on one shared model repository: one routing source, applied without a restart.

Both servers read the same repository copy (tmp), each with its own ports, runtime dir and state dir, as two
pods mounting one ConfigMap or volume would.  300 routing keys land on the same version on both; one server
gets a local admin change (so the two have different routing histories); then a weight change is written to
the shared model.yaml as a deploy tool writes it (a temp file, ``os.replace``), and with no restart and no
admin call it reaches both (bounded poll of ``rollout status``), wins over the local change, both agree key
by key again, and status and ``aieng_routing_generation`` say the same generation on both.  A malformed
model.yaml is then refused on both, reported, and the routing stays.
"""
from __future__ import annotations

import os
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.rollout_helpers import PENGUIN, cli, executor_pid, infer_many, status, tabular_repo
from tests.waits import until

pytestmark = pytest.mark.e2e

KEYS = [f"user-{i}" for i in range(300)]


def replica(make_server, root, repo):
    root.mkdir()
    (root / "run").mkdir()
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_STATE_DIR=str(root / "state"),
                      AIENG_RUNTIME_DIR=str(root / "run"), AIENG_PREPROCESS_WORKERS="1",
                      AIENG_POSTPROCESS_WORKERS="1")
    srv.admin = f"ipc://{root / 'run'}/admin.sock"
    return srv.start(wait=False)


def versions_of(srv) -> dict:
    replies = infer_many(srv, KEYS, PENGUIN, in_flight=32)
    assert all(r["ok"] for r in replies.values()), next(r for r in replies.values() if not r["ok"])
    return {k: r["version"] for k, r in replies.items()}


def routing_metrics(srv) -> dict:
    """``{(name, labels...): value}`` of the routing source gauges of ``tabular``."""
    with urllib.request.urlopen(srv.http + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, s.labels.get("digest", "")): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name.startswith("aieng_routing_") and s.labels.get("model") == "tabular"}


def write_atomically(path, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def test_two_replicas_on_one_model_yaml_route_every_key_alike_and_follow_a_change(make_server, tmp_path):
    repo = tmp_path / "repo"
    tabular_repo(repo, "routing:\n  weights: {'1': 80, '2': 20}\n")
    a = replica(make_server, tmp_path / "a", repo)
    b = replica(make_server, tmp_path / "b", repo)
    a.wait_ready()
    b.wait_ready()
    before_a, before_b = versions_of(a), versions_of(b)
    assert before_a == before_b
    assert set(before_a.values()) == {"1", "2"}
    sa, sb = status(a, "tabular")["source"], status(b, "tabular")["source"]
    assert sa["from"] == sb["from"] == "model.yaml"
    assert sa["generation"] == sb["generation"] == 1 and sa["digest"] == sb["digest"]
    first = sa["digest"]

    # a local change on one replica only: its routing (and its bucket history) now differs from b's
    code, out, err = cli(a, "rollout", "set-weights", "tabular", "1=50", "2=50")
    assert code == 0, err
    assert status(a, "tabular")["source"]["from"] == "local"
    assert versions_of(a) != versions_of(b)

    pids = {s: (s.pid, executor_pid(s)) for s in (a, b)}
    write_atomically(repo / "tabular" / "model.yaml", "routing:\n  weights: {'1': 60, '2': 40}\n")

    def followed() -> dict | None:
        now = {s: status(s, "tabular") for s in (a, b)}
        done = all(st["weights"] == {"1": 60.0, "2": 40.0} and st["source"]["from"] == "model.yaml"
                   for st in now.values())
        return now if done else None

    now = until(followed, 30, 0.5)
    assert now, {s.http: status(s, "tabular") for s in (a, b)}
    sa, sb = now[a]["source"], now[b]["source"]
    assert sa["digest"] == sb["digest"] != first
    assert sa["generation"] == sb["generation"] == 2
    assert now[a]["ranges"] == now[b]["ranges"]  # different histories, the same bucket owners
    after_a, after_b = versions_of(a), versions_of(b)
    assert after_a == after_b
    assert set(after_a.values()) == {"1", "2"}
    assert {s: (s.pid, executor_pid(s)) for s in (a, b)} == pids  # nothing restarted
    ma, mb = routing_metrics(a), routing_metrics(b)
    assert ma == mb
    assert ma[("aieng_routing_generation", sa["digest"])] == 2
    assert ma[("aieng_routing_local_change", "")] == 0
    assert ma[("aieng_routing_model_yaml_refused", "")] == 0

    # a malformed model.yaml: refused on both, reported, and the routing stays
    write_atomically(repo / "tabular" / "model.yaml", "routing:\n  weights: {'1': 60}\n")
    refused = until(lambda: all(status(s, "tabular")["source"]["refused"] for s in (a, b)), 30, 0.5)
    assert refused, {s.http: status(s, "tabular")["source"] for s in (a, b)}
    for s in (a, b):
        st = status(s, "tabular")
        assert "sum to 100" in st["source"]["refused"]["error"]
        assert st["weights"] == {"1": 60.0, "2": 40.0} and st["source"]["generation"] == 2
        assert routing_metrics(s)[("aieng_routing_model_yaml_refused", "")] == 1
    assert versions_of(a) == after_a
    code, out, err = cli(a, "rollout", "status", "tabular")
    assert code == 0 and "routing from model.yaml generation 2" in out and "model.yaml refused" in out, out
