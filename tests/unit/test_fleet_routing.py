"""One routing source for a fleet, without processes: the model.yaml watcher (atomic replacement, a
ConfigMap's ``..data`` swap, a write in place, a malformed or missing file), generations, a model.yaml
change winning over a local change, and replicas with different histories routing every bucket alike."""
import logging
import os
import random

import pytest

from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.rollout import routing
from aieng.frontend.rollout.rollout import Rollout, model_dirs
from aieng.frontend.rollout.watcher import ConfigWatcher, model_yaml_paths
from aieng.models import repo as model_repo
from aieng.models.routing import BUCKETS
from aieng.models.served import ServedVersions

TENSOR_YAML = ("inputs: [{name: x, kind: tensor}]\noutputs: [{name: y, kind: tensor}]\n"
               "preprocess: {type: tensor}\npostprocess: {type: tensor}\n")


def make_repo(root, model_yaml: str, versions=("1", "2", "3")) -> str:
    repo = root / "repo"
    for v in versions:
        d = repo / "m" / v
        d.mkdir(parents=True)
        (d / "model.onnx").write_bytes(b"onnx " + v.encode())
        (d / "model.yaml").write_text(TENSOR_YAML)
    replace(repo / "m" / "model.yaml", model_yaml)
    return str(repo)


def replace(path, text: str) -> None:
    """As a deploy tool writes: a temp file beside it, then a rename over it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def replica(repo: str, metrics=None) -> tuple[Rollout, ConfigWatcher]:
    specs = model_repo.scan(repo)
    watcher = ConfigWatcher(model_yaml_paths(model_dirs(specs)), start=False)
    return Rollout(ServedVersions(specs), None, None, metrics, watcher), watcher


def step(r: Rollout, w: ConfigWatcher) -> None:
    """One poll of the watcher's thread, then one tick of the loop."""
    w.poll()
    r.tick(0.0)


W = "routing:\n  weights: {'1': %d, '2': %d, '3': %d}\n"


# -- the watcher ----------------------------------------------------------------------------------
def test_an_atomic_replacement_is_seen_and_a_touch_or_the_same_bytes_are_not(tmp_path):
    repo = make_repo(tmp_path, W % (90, 10, 0))
    path = os.path.join(repo, "m", "model.yaml")
    w = ConfigWatcher({"m": path}, start=False)
    w.poll()
    first = w.take()
    assert [c.settings for c in first] == [{"routing": {"weights": {"1": 90, "2": 10, "3": 0}}}]
    w.poll()
    assert w.take() == []  # nothing changed
    os.utime(path)  # touched: read again, same digest, nothing handed over
    w.poll()
    assert w.take() == []
    replace(path, W % (90, 10, 0))  # a new inode, the same bytes
    w.poll()
    assert w.take() == []
    replace(path, W % (80, 20, 0))
    w.poll()
    (change,) = w.take()
    assert change.settings == {"routing": {"weights": {"1": 80, "2": 20, "3": 0}}}
    assert change.error is None and change.digest != first[0].digest


def test_a_configmap_style_data_symlink_swap_is_seen(tmp_path):
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "..2026_12_01").mkdir()
    (mount / "..2026_12_01" / "model.yaml").write_text(W % (90, 10, 0))
    os.symlink("..2026_12_01", mount / "..data")
    os.symlink("..data/model.yaml", mount / "model.yaml")
    w = ConfigWatcher({"m": str(mount / "model.yaml")}, start=False)
    w.poll()
    assert len(w.take()) == 1
    # kubelet: a new timestamped dir, a new ..data link beside it, renamed over the old one
    (mount / "..2026_12_02").mkdir()
    (mount / "..2026_12_02" / "model.yaml").write_text(W % (50, 50, 0))
    os.symlink("..2026_12_02", mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")
    w.poll()
    (change,) = w.take()
    assert change.settings["routing"]["weights"] == {"1": 50, "2": 50, "3": 0}


def test_a_write_in_place_is_read_once_it_stays_put_for_a_poll(tmp_path):
    repo = make_repo(tmp_path, W % (90, 10, 0))
    path = os.path.join(repo, "m", "model.yaml")
    w = ConfigWatcher({"m": path}, start=False)
    w.poll()
    w.take()
    with open(path, "w") as fh:  # the same inode, half written
        fh.write("routing:\n  weights: {'1': 7")
    w.poll()
    assert w.take() == []  # settling: not read yet
    with open(path, "w") as fh:
        fh.write(W % (70, 30, 0))
    w.poll()
    assert w.take() == []  # changed again: still settling
    w.poll()
    (change,) = w.take()
    assert change.settings["routing"]["weights"] == {"1": 70, "2": 30, "3": 0}


# -- the loop applies it ------------------------------------------------------------------------------
def test_a_new_model_yaml_is_applied_as_a_new_generation_shown_in_status_and_metrics(tmp_path):
    repo = make_repo(tmp_path, W % (90, 10, 0))
    metrics = Metrics()
    r, w = replica(repo, metrics)
    step(r, w)  # the first poll reads the file the scan read: nothing changes
    src = r.status("m", 0.0)["source"]
    assert (src["from"], src["generation"], src["refused"]) == ("model.yaml", 1, None)
    first_digest = src["digest"]
    sample = metrics.registry.get_sample_value
    assert sample("aieng_routing_generation", {"model": "m", "digest": first_digest}) == 1
    replace(os.path.join(repo, "m", "model.yaml"), W % (70, 20, 10))
    step(r, w)
    m = r.models["m"]
    assert m.state.weights == {"1": 70.0, "2": 20.0, "3": 10.0}
    src = r.status("m", 0.0)["source"]
    assert (src["from"], src["generation"]) == ("model.yaml", 2) and src["digest"] != first_digest
    assert sample("aieng_routing_generation", {"model": "m", "digest": src["digest"]}) == 2
    assert sample("aieng_routing_generation", {"model": "m", "digest": first_digest}) is None  # removed
    assert m.events[-1]["kind"] == "model_yaml" and m.history  # the routing it replaced can be rolled back to


def test_a_model_yaml_change_wins_over_a_local_change_made_before_it(tmp_path):
    repo = make_repo(tmp_path, W % (90, 10, 0))
    metrics = Metrics()
    r, w = replica(repo, metrics)
    m = r.models["m"]
    r.change(m, routing.build(m.state, m.versions, {"1": 50, "2": 50, "3": 0}, reason="set_weights"))
    r.tick(0.0)
    src = r.status("m", 0.0)["source"]
    assert (src["from"], src["reason"], src["generation"]) == ("local", "set_weights", 1)
    assert metrics.registry.get_sample_value("aieng_routing_local_change", {"model": "m"}) == 1
    replace(os.path.join(repo, "m", "model.yaml"), W % (80, 20, 0))
    step(r, w)
    assert m.state.weights == {"1": 80.0, "2": 20.0, "3": 0.0}
    assert r.status("m", 0.0)["source"]["from"] == "model.yaml"
    assert metrics.registry.get_sample_value("aieng_routing_local_change", {"model": "m"}) == 0


@pytest.mark.parametrize("text, why", [
    ("routing: {weights: {'1': 60}}\n", "sum to 100"),  # valid YAML, invalid routing
    ("routing: [weights\n", "model.yaml"),  # not YAML
    ("routes: {}\n", "takes only"),  # an unknown key
    ("routing:\n  weights: {'9': 100}\n", "unknown version"),
])
def test_a_malformed_model_yaml_is_refused_logged_once_keeps_the_routing_and_is_reported(tmp_path, caplog,
                                                                                         text, why):
    repo = make_repo(tmp_path, W % (90, 10, 0))
    metrics = Metrics()
    r, w = replica(repo, metrics)
    step(r, w)
    before = r.models["m"].state
    path = os.path.join(repo, "m", "model.yaml")
    with caplog.at_level(logging.ERROR, logger="aieng.frontend.rollout.rollout"):
        replace(path, text)
        step(r, w)
        step(r, w)
        os.utime(path)
        step(r, w)
    assert r.models["m"].state is before
    refused = r.status("m", 0.0)["source"]["refused"]
    assert why in refused["error"]
    assert len([x for x in caplog.records if "refused" in x.getMessage()]) == 1
    assert metrics.registry.get_sample_value("aieng_routing_model_yaml_refused", {"model": "m"}) == 1
    assert r.status("m", 0.0)["source"]["generation"] == 1
    replace(path, W % (60, 40, 0))  # fixed: applied, and no longer reported
    step(r, w)
    assert r.models["m"].state.weights == {"1": 60.0, "2": 40.0, "3": 0.0}
    assert r.status("m", 0.0)["source"]["refused"] is None
    assert metrics.registry.get_sample_value("aieng_routing_model_yaml_refused", {"model": "m"}) == 0


def test_a_model_yaml_that_disappears_is_refused_not_taken_for_the_default(tmp_path):
    repo = make_repo(tmp_path, W % (90, 10, 0))
    r, w = replica(repo)
    step(r, w)
    os.unlink(os.path.join(repo, "m", "model.yaml"))
    step(r, w)
    assert r.models["m"].state.weights == {"1": 90.0, "2": 10.0, "3": 0.0}  # not 100 % to version 3
    assert "missing" in r.status("m", 0.0)["source"]["refused"]["error"]


# -- replicas agree ------------------------------------------------------------------------------------
def test_replicas_with_different_histories_agree_on_every_bucket_after_a_model_yaml_change(tmp_path):
    """Minimal-movement moves depend on history; a model.yaml generation does not: replica A had local changes
    (and a rollback), B had none, C starts after the change; all three own every bucket alike."""
    a_repo = make_repo(tmp_path / "a", W % (80, 10, 10))
    a, aw = replica(a_repo)
    b, bw = replica(a_repo)
    ma = a.models["m"]
    rnd = random.Random(22)
    for _ in range(6):
        x = rnd.randrange(0, 101)
        y = rnd.randrange(0, 101 - x)
        a.change(ma, routing.build(ma.state, ma.versions, {"1": x, "2": y, "3": 100 - x - y}))
    a.rollback(ma)
    for target in [(70, 20, 10), (50, 25, 25), (34, 33, 33), (0, 0, 100)]:
        replace(os.path.join(a_repo, "m", "model.yaml"), W % target)
        step(a, aw)
        step(b, bw)
        c, _ = replica(a_repo)
        owners = {a.models["m"].state.owner, b.models["m"].state.owner, c.models["m"].state.owner}
        assert len(owners) == 1, target
        keys = [f"user-{i}" for i in range(300)]
        route = lambda r: [r.models["m"].state.decide(k, "", None, {}, {})[0] for k in keys]  # noqa: E731
        assert route(a) == route(b) == route(c)


def test_two_version_canary_steps_from_model_yaml_move_only_the_buckets_that_change_owner(tmp_path):
    """Rebuilding from the file alone still moves the fewest buckets for a two-version canary."""
    repo = make_repo(tmp_path, W % (95, 5, 0))
    r, w = replica(repo)
    prev = r.models["m"].state.owner
    for canary in (10, 25, 50, 100):
        replace(os.path.join(repo, "m", "model.yaml"), W % (100 - canary, canary, 0))
        step(r, w)
        now = r.models["m"].state.owner
        moved = sum(1 for x, y in zip(prev, now) if x != y)
        assert moved == canary * BUCKETS // 100 - prev.count("2")
        assert all(y == "2" for x, y in zip(prev, now) if x == "2")  # every user on the canary stays there
        prev = now


def test_a_reload_reports_a_generation_the_watcher_applied_first_once(tmp_path):
    repo = make_repo(tmp_path, W % (90, 10, 0))
    r, w = replica(repo)
    step(r, w)
    assert r.reload_from_disk() == []
    replace(os.path.join(repo, "m", "model.yaml"), W % (60, 40, 0))
    step(r, w)  # the watcher got there first
    assert r.reload_from_disk() == ["m"]  # what an operator who edited the file and reloaded expects
    m = r.models["m"]
    assert [e["kind"] for e in m.events[-2:]] == ["model_yaml", "reload"]
    assert m.state.weights == {"1": 60.0, "2": 40.0, "3": 0.0} and m.generation.number == 2
    assert r.reload_from_disk() == []
