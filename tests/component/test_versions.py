"""The version manager against fakes: a hub that records what it is sent, workers known from hellos, a
request table that says what is in flight, and a pipeline ``start`` that collects golden requests (the
test answers them).  Real pieces: the routing (``Rollout``, nothing saved), the metrics, a copy of the
demo ``tabular`` model on disk.  Covered: a load built in every worker and passed by its golden set; a
golden case that fails; the pool evicting an idle version to load a cold one; an unload while requests
are in flight; an unload refused while routed to.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import pytest

from aieng.config import Config
from aieng.frontend.control.workers import Workers
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.requests.table import GOLDEN, Request
from aieng.frontend.rollout import routing
from aieng.frontend.rollout.rollout import Rollout
from aieng.frontend.versions.golden import _input
from aieng.frontend.versions.manager import VersionManager
from aieng.models import repo as model_repo
from aieng.models.sections import PoolSetting, Routing
from aieng.models.served import ServedVersions
from aieng.wire import messages as m
from aieng.wire import protocol as p
from tests.waits import until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILDERS = {"pre-0": "preprocess", "executor": "executor", "post-0": "postprocess"}
MIB = 1 << 20


class Hub:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def __call__(self, worker: str, frames: list) -> bool:
        self.sent.append((worker, m.decode(frames[0])))
        return True

    def of(self, kind: type) -> list[tuple[str, object]]:
        return [(w, msg) for w, msg in self.sent if isinstance(msg, kind)]


class Table:
    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.rids = iter(range(1, 10_000))

    def new_rid(self) -> int:
        return next(self.rids)

    def per_model(self) -> dict[str, int]:
        return dict(self.in_flight)


class Rig:
    def __init__(self, tmp_path, served=("1",), cold=(), lazy=False, **cfg):
        repo = tmp_path / "repo"
        shutil.copytree(os.path.join(ROOT, "models", "tabular"), repo / "tabular")
        self.specs = {"tabular": {}}
        for v in served:
            spec = model_repo.load_spec("tabular", v, str(repo / "tabular" / v))
            spec = dataclasses.replace(spec, pool=PoolSetting(lazy=True) if lazy else PoolSetting(),
                                       routing=Routing.parse({"weights": {"1": 100}}))  # model-wide
            self.specs["tabular"][v] = spec
        self.specs = ServedVersions(self.specs)
        self.cfg = Config(cold_versions=[f"tabular:{v}" for v in cold], **cfg)
        self.hub, self.table, self.workers = Hub(), Table(), Workers()
        for name, role in BUILDERS.items():
            self.workers.hello(m.Hello(name, role, 100 + len(self.workers.by_name)), time.monotonic())
        self.rollout = Rollout(self.specs, None, None, Metrics())
        self.started: list[Request] = []
        self.refused: list[tuple[Request, str, str]] = []
        self.vm = VersionManager(self.cfg, self.specs, self.hub, self.workers, self.rollout,
                                 self.started.append, self.table, Metrics(),
                                 lambda req, code, msg: self.refused.append((req, code, msg)))
        self.golden = {v: json.loads((repo / "tabular" / v / "golden.json").read_text())
                       for v in ("1", "2")}

    def state(self, key: str) -> str | None:
        return self.vm.loads_view().get(key, {}).get("state")

    def validated(self, key: str) -> str:
        """Tick the loop until the validation thread is done; the state after it."""
        until(lambda: (self.vm.tick(time.monotonic()), self.state(key) != "validating")[1], 30)
        return self.state(key)

    def build_everywhere(self, key: str, footprint: int = 0) -> None:
        """Every builder answers VersionLoaded (preprocess workers one at a time, as they are sent it)."""
        for _ in range(len(BUILDERS)):
            asked = {w for w, msg in self.hub.of(m.LoadVersion)
                     if msg.spec.key == key and not msg.ready}
            done = {w for w, msg in self.hub.of(m.VersionLoaded)}
            for w in sorted(asked & set(BUILDERS) - done):
                msg = m.VersionLoaded(w, key, 0.1, footprint if w == "executor" else 0)
                self.hub.sent.append((w, msg))  # remembered as answered
                self.vm.handlers[m.VersionLoaded](msg, w.encode())

    def answer_golden(self, wrong_case: int | None = None) -> int:
        """Answer every golden request started so far (and those its answers start), in the order they
        were sent (the cases' order); how many."""
        self.case_of: dict[str, int] = {}
        answered = 0
        while self.started and self.started[0].kind is GOLDEN:
            req = self.started.pop(0)
            cases = self.golden[req.version]["cases"]
            case = self.case_of[req.client_id] = len(self.case_of)
            expected = cases[case]["expected"]
            outputs = {"label": "Gentoo"} if case == wrong_case else expected
            req.link.answer(p.pack({"id": req.client_id, "ok": True, "outputs": outputs}))
            answered += 1
        return answered


def infer_request(rig: Rig, version: str, rid: int) -> tuple[Request, dict]:
    now = time.monotonic()
    inputs = {k: _input(v) for k, v in rig.golden[version]["cases"][0]["inputs"].items()}
    return Request(rid, [b"client"], rid, "tabular", version, now + 30, now, {}), inputs


def test_a_load_is_built_in_every_worker_then_golden_checked_then_routable(tmp_path):
    rig = Rig(tmp_path)
    out = rig.vm.load("tabular", "2")
    assert out["load"]["state"] == "validating"
    assert rig.validated("tabular:2") == "loading"
    first = rig.hub.of(m.LoadVersion)
    assert first[0][0] == "supervisor"  # first: a worker restarted from now on comes up with it
    assert {w for w, _ in first} == {"supervisor", "executor", "post-0", "pre-0"}
    assert "pre-0" in rig.workers.resting  # out of the rotation while it builds
    assert "2" not in rig.specs["tabular"]  # not routable before its golden set passed
    rig.build_everywhere("tabular:2")
    assert "pre-0" not in rig.workers.resting
    assert rig.state("tabular:2") == "golden"
    assert rig.answer_golden() == len(rig.golden["2"]["cases"])
    assert rig.state("tabular:2") == "ready"
    assert "2" in rig.specs["tabular"]
    assert "2" in rig.rollout.model("tabular").versions
    assert rig.rollout.weights("tabular")[1].get("2", 0) == 0  # routable at weight 0
    ready = [msg for w, msg in rig.hub.of(m.LoadVersion) if msg.ready]
    assert [msg.spec.version for msg in ready] == ["2"]
    assert not rig.hub.of(m.UnloadVersion)


def test_a_failed_golden_case_leaves_the_version_unroutable_and_released(tmp_path):
    rig = Rig(tmp_path)
    rig.vm.load("tabular", "2")
    rig.validated("tabular:2")
    rig.build_everywhere("tabular:2")
    rig.answer_golden(wrong_case=0)
    view = rig.vm.loads_view()["tabular:2"]
    assert view["state"] == "failed"
    assert "golden case 0" in view["error"] and "Gentoo" in view["error"]
    assert "2" not in rig.specs["tabular"] and "2" not in rig.rollout.model("tabular").versions
    released = {w for w, msg in rig.hub.of(m.UnloadVersion) if msg.key == "tabular:2"}
    assert released == {"supervisor", "executor", "post-0", "pre-0"}
    assert rig.rollout.model("tabular").events[-1]["kind"] == "load_failed"


def test_the_pool_evicts_an_idle_version_to_load_a_cold_one(tmp_path):
    rig = Rig(tmp_path, served=("1", "2"), cold=("1", "2"), lazy=True, model_memory_budget=150 * MIB,
              pool_warm_s=0.0)
    req, inputs = infer_request(rig, "1", 1)
    assert rig.vm.start(req, inputs) is False  # it waits for the cold load
    assert rig.validated("tabular:1") == "loading"
    rig.build_everywhere("tabular:1", footprint=100 * MIB)
    rig.answer_golden()
    assert rig.vm.pool_view()["versions"]["tabular:1"]["state"] == "resident"
    assert rig.started == [req]  # the waiter went on its way once the version was ready
    rig.started.clear()
    req2, inputs2 = infer_request(rig, "2", 2)
    assert rig.vm.start(req2, inputs2) is False
    # 1 measured 100 MiB, so 2 is estimated at 100: both do not fit in 150, and 1 is idle and not warm
    evicted = [(w, msg) for w, msg in rig.hub.of(m.UnloadVersion) if msg.key == "tabular:1"]
    assert {w for w, _ in evicted} == {"supervisor", "executor", "post-0", "pre-0"}
    assert all(msg.evict for _, msg in evicted)  # kept as cold: still served, built again on use
    assert rig.state("tabular:1") == "evicted"
    assert rig.vm.pool_view()["versions"]["tabular:1"]["evictions"] == 1
    assert rig.refused == []


def test_an_unload_drains_what_is_in_flight_before_releasing(tmp_path):
    rig = Rig(tmp_path, served=("1", "2"))
    rig.table.in_flight["tabular:2"] = 3
    out = rig.vm.unload("tabular", "2")
    assert out["in_flight"] == 3 and out["load"]["state"] == "draining"
    assert "2" not in rig.specs["tabular"]  # no longer pinnable or routable at once
    assert "2" not in rig.rollout.model("tabular").versions
    rig.vm.tick(time.monotonic())
    assert rig.hub.of(m.UnloadVersion) == []  # still serving the three
    rig.table.in_flight["tabular:2"] = 0
    rig.vm.tick(time.monotonic())
    assert rig.state("tabular:2") == "unloaded"
    assert {w for w, msg in rig.hub.of(m.UnloadVersion)} == {"supervisor", "executor", "post-0", "pre-0"}


def test_an_unload_is_refused_while_routed_to_and_changes_nothing(tmp_path):
    rig = Rig(tmp_path, served=("1", "2"))
    model = rig.rollout.model("tabular")
    rig.rollout.change(model, routing.build(model.state, model.versions, {"1": 90, "2": 10}, reason="test"))
    with pytest.raises(p.RequestError) as err:
        rig.vm.unload("tabular", "2")
    assert err.value.code == p.INVALID_REQUEST and "weight 10%" in err.value.message
    assert "2" in rig.specs["tabular"] and "2" in model.versions
    assert rig.vm.loads_view() == {} and rig.hub.sent == []


def test_a_load_of_an_unknown_model_or_a_missing_directory_is_refused(tmp_path):
    rig = Rig(tmp_path)
    with pytest.raises(p.RequestError) as err:
        rig.vm.load("nope", "1")
    assert err.value.code == p.MODEL_NOT_FOUND
    with pytest.raises(p.RequestError) as err:
        rig.vm.load("tabular", "9")
    assert err.value.code == p.MODEL_NOT_FOUND and "no version directory" in err.value.message
    assert rig.vm.loads_view() == {}
