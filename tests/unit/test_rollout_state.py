"""The frontend's routing state around the pure logic: canary windows, the state file (each group stored
once, format 1 still read), restore rules, changes that cannot be saved, the bounded history, rollback,
auto-rollback, and the model-wide model.yaml."""
import json
import os
import time

import pytest

from aieng.frontend.rollout import model as model_mod
from aieng.frontend.rollout import rollout as rollout_mod
from aieng.frontend.rollout import routing
from aieng.frontend.rollout.canary import Watch
from aieng.frontend.rollout.rollout import Rollout
from aieng.frontend.rollout.routestore import RouteStore, Saved, store_path
from aieng.frontend.rollout.statewriter import StateWriter
from aieng.models import repo as model_repo
from aieng.models.routing import AutoRollback, RoutingError
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p

TENSOR_YAML = ("inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
               "preprocess: {type: tensor}\npostprocess: {type: tensor}\n")


def repo_with(tmp_path, model_yaml: str | None, versions=("1", "2", "3"), meta: str = "") -> str:
    repo = tmp_path / "repo"
    for v in versions:
        d = repo / "m" / v
        d.mkdir(parents=True)
        (d / "model.onnx").write_bytes(b"onnx " + v.encode())  # the scan only checks it exists
        (d / "model.yaml").write_text(TENSOR_YAML + meta)
    if model_yaml is not None:
        (repo / "m" / "model.yaml").write_text(model_yaml)
    return str(repo)


# -- canary windows ---------------------------------------------------------------------
POLICY = AutoRollback(max_error_rate_delta=0.1, max_p99_ratio=2.0, window_s=10, min_requests=10)


def test_error_rate_over_stable_by_more_than_the_delta_is_a_verdict():
    w = Watch(POLICY)
    for i in range(20):
        w.observe("1", 100.0, "OK", 0.01)
        w.observe("2", 100.0, "INTERNAL" if i % 4 == 0 else "OK", 0.01)  # 25 % errors
    version, why = w.verdict(101.0, "1", ["2"])
    assert version == "2" and "error rate 25.0%" in why


def test_client_errors_do_not_count_and_few_requests_are_not_judged():
    w = Watch(POLICY)
    for _ in range(20):
        w.observe("2", 100.0, "INVALID_INPUT", 0.0)
    for _ in range(9):
        w.observe("2", 100.0, "TIMEOUT", 1.0)
    assert w.verdict(101.0, "1", ["2"]) is None  # 9 < min_requests: INVALID_INPUT was not counted


def test_p99_over_ratio_is_a_verdict_and_old_samples_leave_the_window():
    w = Watch(POLICY)
    for _ in range(20):
        w.observe("1", 100.0, "OK", 0.010)
        w.observe("2", 100.0, "OK", 0.050)
    assert w.verdict(101.0, "1", ["2"])[0] == "2"
    assert w.verdict(111.0, "1", ["2"]) is None  # all samples older than window_s


@pytest.mark.parametrize("raw", [{"window_s": 0}, {"nope": 1}, {"min_requests": -1}, {"max_p99_ratio": 0.5},
                                 "on"])
def test_bad_auto_rollback_settings_are_refused(raw):
    with pytest.raises(ValueError):
        AutoRollback.parse(raw)


# -- the state file -------------------------------------------------------------------------
def test_store_round_trip_is_atomic_and_a_corrupt_file_is_ignored(tmp_path):
    path = store_path(str(tmp_path / "state"), "/some/repo")
    s = RouteStore(path)
    assert s.load() == {}
    state = routing.build(None, {"1", "2"}, {"1": 90, "2": 10})
    s.save({"m": Saved("abc", state, (), ({"kind": "reload", "at": 1.0},))})
    assert s.load() == {"m": {"config_digest": "abc", "current": state.public(), "history": [],
                              "events": [{"kind": "reload", "at": 1.0}]}}
    assert os.listdir(tmp_path / "state") == [os.path.basename(path)]  # no temp file left
    with open(path, "w") as fh:
        fh.write("{not json")
    assert s.load() == {}


# -- the rollout controller -----------------------------------------------------------------
@pytest.fixture
def rollout():
    """``rollout(repo, state_dir)``: a Rollout with its store and writer, as the frontend builds it."""
    made: list[Rollout] = []

    def make(repo: str, state_dir, retry_s: float = 5.0) -> Rollout:
        store = RouteStore(store_path(str(state_dir), repo))
        r = Rollout(ServedVersions(model_repo.scan(repo)), store,
                    StateWriter(store.save, store.path, retry_s=retry_s))
        made.append(r)
        return r

    yield make
    for r in made:
        r.writer.close(5)


def settle(r: Rollout, *tickets) -> bool:
    """The loop's side: wait until the writer wrote what it was handed, then deliver the tickets."""
    saved = r.writer.flush(10)
    r.writer.poll()
    assert all(t.done for t in tickets)
    return saved


def test_changes_are_saved_and_restored_while_model_yaml_is_unchanged(tmp_path, rollout):
    repo = repo_with(tmp_path, "routing:\n  weights: {'1': 90, '2': 10}\n")
    r = rollout(repo, tmp_path / "st")
    m = r.models["m"]
    t = r.change(m, routing.build(m.state, m.versions, {"1": 80, "2": 20}))
    assert settle(r, t) and t.error is None
    again = rollout(repo, tmp_path / "st").models["m"]
    assert again.state == m.state and again.history == m.history
    # model.yaml edited: it wins, and what it replaced is history
    (tmp_path / "repo" / "m" / "model.yaml").write_text("routing:\n  weights: {'1': 50, '3': 50}\n")
    r2 = rollout(repo, tmp_path / "st")
    assert r2.models["m"].state.weights == {"1": 50.0, "3": 50.0}
    assert r2.models["m"].state.reason == "model.yaml"


def test_a_change_that_cannot_be_saved_stays_in_force_says_so_and_is_saved_once_it_can(tmp_path, rollout):
    repo = repo_with(tmp_path, None)
    blocker = tmp_path / "st"
    blocker.write_text("a file where the state dir should be")
    r = rollout(repo, blocker, retry_s=0.05)
    m = r.models["m"]
    before = m.state
    new = routing.build(m.state, m.versions, {"3": 50, "1": 50})
    t = r.change(m, new)
    assert m.state is new and m.history == [before]  # in force at once, before any write
    assert not settle(r, t)
    assert t.error.startswith(f"could not save routing state to {r.store.path}: ")
    assert m.state is new  # not undone: later changes may stand on it
    blocker.unlink()  # the disk is back: the writer's retry saves it, without a new change
    assert until_saved(r, lambda saved: saved["m"]["current"]["weights"] == {"1": 50.0, "3": 50.0})


def until_saved(r: Rollout, check) -> bool:
    from tests.waits import until
    return until(lambda: os.path.exists(r.store.path) and check(r.store.load()), 10)


def test_a_group_is_stored_once_however_many_states_name_it(tmp_path, rollout):
    repo = repo_with(tmp_path, "routing:\n  weights: {'1': 100}\n")
    r = rollout(repo, tmp_path / "st")
    m = r.models["m"]
    keys = [f"user-{i:05d}" for i in range(5000)]
    r.change(m, routing.build(m.state, m.versions, rules={
        "groups": {"beta": keys}, "rules": [{"name": "beta", "group": "beta", "version": "2"}]}))
    for i in range(1, 17):  # 16 weight changes after it: 17 states name the group
        r.change(m, routing.build(m.state, m.versions, {"1": 100 - i, "3": i}))
    assert settle(r)
    text = open(r.store.path, encoding="utf-8").read()
    data = json.loads(text)
    assert data["format"] == 2 and len(data["models"]["m"]["history"]) == 16
    (digest,) = data["groups"]
    assert data["groups"][digest] == keys  # in the order given
    named = [s["groups"] for s in [data["models"]["m"]["current"]] + data["models"]["m"]["history"]]
    assert named == [{"beta": digest}] * 17  # 17 changes: the routing before set_rules left the history
    assert text.count('"user-04321"') == 1
    again = rollout(repo, tmp_path / "st").models["m"]
    assert again.state == m.state and again.history == m.history
    assert again.history[-1].groups["beta"] is again.state.groups["beta"]  # one object in memory too
    assert again.state.decide("user-04321", "", None, {}, {}) == ("2", "rule:beta")


def test_a_format_1_file_is_read_and_its_copies_of_a_group_become_one(tmp_path, rollout):
    repo = repo_with(tmp_path, "routing:\n  weights: {'1': 100}\n")
    state = routing.build(None, {"1", "2", "3"}, {"1": 100}, rules={
        "groups": {"g": ["a", "b"]}, "rules": [{"name": "g", "group": "g", "version": "2"}]})
    older = routing.build(state, {"1", "2", "3"}, {"1": 50, "2": 50})
    saved = {"config_digest": rollout_mod.digest({"weights": {"1": 100}}), "current": state.public(),
             "history": [older.public()], "events": []}
    path = store_path(str(tmp_path / "st"), repo)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        json.dump({"format": 1, "saved_at": 0, "models": {"m": saved}}, fh)
    m = rollout(repo, tmp_path / "st").models["m"]
    assert m.state == state and m.history == [older]
    assert m.history[0].groups["g"] is m.state.groups["g"]


def test_history_keeps_within_the_group_budget_and_always_the_previous_routing(tmp_path, rollout,
                                                                              monkeypatch):
    monkeypatch.setattr(model_mod, "SAVED_GROUP_CHARS", 2 * 1100)
    repo = repo_with(tmp_path, "routing:\n  weights: {'1': 100}\n")
    r = rollout(repo, tmp_path / "st")
    m = r.models["m"]
    for i in range(5):  # five routings, each with its own group of 1,000 characters (100 keys of 9 + 1)
        group = [f"g{i}-{k:06d}" for k in range(100)]
        r.change(m, routing.build(m.state, m.versions, rules={
            "groups": {"g": group}, "rules": [{"name": "g", "group": "g", "version": "2"}]}))
        for w in (10, 20):  # weight changes share the group: they cost nothing more
            r.change(m, routing.build(m.state, m.versions, {"1": 100 - w - i, "2": w + i}))
    assert m.state.groups["g"].order[0] == "g4-000000"
    # g4's and g3's groups fit the budget of 2,200 (the states of g2 would not): the newest 5 entries are kept
    assert [s.groups["g"].order[0] for s in m.history] == ["g3-000000"] * 3 + ["g4-000000"] * 2
    assert settle(r)
    assert len(json.load(open(r.store.path))["groups"]) == 2


def test_a_routing_whose_groups_pass_the_character_limit_is_refused():
    keys = [f"{i:042d}" for i in range(100_000)]  # 43 characters each with the separator: 4.3 Mi in all
    why = (r"the groups hold 4,300,000 characters of routing keys \(each key's length \+ 1\), "
           r"over the limit of 4,194,304 for one routing")
    with pytest.raises(RoutingError, match=why):
        routing.build(None, {"1", "2"}, {"1": 100}, rules={
            "groups": {"big": keys}, "rules": [{"name": "big", "group": "big", "version": "2"}]})
    assert routing.build(None, {"1", "2"}, {"1": 100}, rules={  # 100,000 keys of 40 characters fit
        "groups": {"big": [k[2:] for k in keys]}, "rules": []}).groups["big"].chars == 4_100_000


def test_route_pins_sha256_prefixes_and_refuses_short_or_unknown(tmp_path, rollout):
    repo = repo_with(tmp_path, "routing:\n  weights: {'3': 100}\n")
    r = rollout(repo, tmp_path / "st")
    h2 = r.models["m"].specs["2"].content_hash
    req = {"id": 1, "inputs": {}}
    assert r.route("m", dict(req, version="sha256:" + h2[:12]), {}, None) == ("2", "pinned")
    assert r.route("m", req, {}, "alice") == ("3", "weight")
    with pytest.raises(p.RequestError, match="at least 12"):
        r.route("m", dict(req, version="sha256:" + h2[:11]), {}, None)
    with pytest.raises(p.RequestError, match="no version"):
        r.route("m", dict(req, version="sha256:" + "0" * 64), {}, None)


def test_auto_rollback_moves_the_canary_to_zero_and_records_why(tmp_path, rollout):
    auto = "  auto_rollback: {max_error_rate_delta: 0.1, window_s: 30, min_requests: 5}\n"
    repo = repo_with(tmp_path, "routing:\n  weights: {'1': 80, '2': 20}\n" + auto)
    r = rollout(repo, tmp_path / "st")
    for _ in range(10):
        r.observe("m", "1", "OK", 0.01)
        r.observe("m", "2", "INTERNAL", 0.01)
    r.tick(time.monotonic())
    m = r.models["m"]
    assert m.state.weights == {"1": 100.0, "2": 0.0}
    assert m.events[-1]["kind"] == "auto_rollback" and m.events[-1]["version"] == "2"
    assert settle(r)  # handed to the writer by tick itself
    saved = json.load(open(r.store.path))["models"]["m"]
    assert saved["current"]["weights"] == {"1": 100.0, "2": 0.0}
    t = r.rollback(m)
    assert m.state.weights == {"1": 80.0, "2": 20.0}
    assert settle(r, t) and t.error is None


def test_reload_is_all_or_nothing(tmp_path, rollout):
    repo = repo_with(tmp_path, "routing:\n  weights: {'1': 100}\n")
    r = rollout(repo, tmp_path / "st")
    with pytest.raises(model_repo.ModelError, match="sum to 100"):
        r.reload({"m": {"routing": {"weights": {"1": 60}}}})
    assert r.models["m"].state.weights == {"1": 100.0}
    assert r.reload({"m": {"routing": {"weights": {"1": 60, "2": 40}}}}) == ["m"]
    assert r.models["m"].state.weights == {"1": 60.0, "2": 40.0}
    assert r.reload({"m": {"routing": {"weights": {"1": 60, "2": 40}}}}) == []


# -- the model-wide model.yaml -----------------------------------------------------------------
@pytest.mark.parametrize("policy, served", [("all", ["1", "2", "3"]), ({"latest": 2}, ["2", "3"]),
                                            (["1", 3], ["1", "3"])])
def test_version_policy(tmp_path, policy, served):
    repo = repo_with(tmp_path, json.dumps({"versions": policy}))
    assert list(model_repo.scan(repo)["m"]) == served


@pytest.mark.parametrize("text, why", [
    ("versions: {latest: 0}", "latest must be"), ("versions: ['7']", "no directory"),
    ("routing: {weights: {'1': 50}}", "sum to 100"), ("colour: blue", "takes only"),
    ("routing: {weights: {'1': 100}, auto_rollback: {window_s: -1}}", "non-negative"),
    ("routing: {rules: [{name: r, group: g, version: '1'}]}", "unknown group"),
    ("versions: {latest: 1}\nrouting: {weights: {'1': 100}}", "unknown version '1'"),
])
def test_bad_model_wide_yaml_fails_the_scan_naming_the_file(tmp_path, text, why):
    repo = repo_with(tmp_path, text)
    with pytest.raises(model_repo.ModelError, match=why) as exc:
        model_repo.scan(repo)
    assert os.path.join("m", "model.yaml") in str(exc.value)


def test_version_metadata(tmp_path):
    repo = repo_with(tmp_path, None, versions=("1",),
                     meta="metadata: {created: 2026-11-01, metrics: {auc: 0.9}, notes: first}\n")
    spec = model_repo.scan(repo)["m"]["1"]
    assert spec.public()["metadata"] == {"created": "2026-11-01", "metrics": {"auc": 0.9}, "notes": "first"}
    bad = repo_with(tmp_path / "b", None, versions=("1",), meta="metadata: {owner: me}\n")
    with pytest.raises(model_repo.ModelError, match="metadata"):
        model_repo.scan(bad)
