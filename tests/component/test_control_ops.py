"""Client ops and admin ops against fake peers: workers known from hellos, a hub that records what it
is sent, a versions fake that records loads and unloads, a mirror fake; the routing (``Rollout``) and the
serving state (``Lifecycle``) are the real ones.  Covered: health follows the supervisor and draining;
log_level reaches every process, and a bad level reaches none; log_level without a level reads it and tells
no process; a version a worker failed to load shows its
error in ``models`` and cannot be given weight; admin requests that are not maps or name no op are refused.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time

import msgpack
import pytest

from aieng.frontend.control.admin import AdminOps, Pending
from aieng.frontend.control.lifecycle import Lifecycle
from aieng.frontend.control.ops import ClientOps
from aieng.frontend.control.views import Views
from aieng.frontend.control.workers import Workers
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.observe.stats import StageStats
from aieng.frontend.rollout.rollout import Rollout
from aieng.models import repo as model_repo
from aieng.models.sections import Routing
from aieng.models.served import ServedVersions
from aieng.wire import messages as m
from aieng.wire import protocol as p

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOG = logging.getLogger("test.ops")


class Hub:
    def __init__(self, gone: set[str] = frozenset()):
        self.sent: list[tuple[str, object]] = []
        self.gone = gone

    def __call__(self, worker: str, frames: list) -> bool:
        if worker in self.gone:
            return False
        self.sent.append((worker, m.decode(frames[0])))
        return True


class Table:
    def __len__(self) -> int:
        return 2

    def depth(self) -> dict[str, int]:
        return {"preprocess": 1, "executor": 1, "postprocess": 0}

    def load(self, holder: str) -> int:
        return 1

    def busy(self, holder: str) -> int:  # load and the answered requests it still works on
        return 1


class Mirror:
    def __init__(self) -> None:
        self.resets = 0

    def view(self, model: str | None = None) -> dict:
        return {}

    def reset(self) -> None:
        self.resets += 1


class Versions:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def load(self, name: str, version: str, source: str = "admin") -> dict:
        self.calls.append(("load", name, version))
        return {"model": name, "version": version, "load": {"state": "validating"}}

    def unload(self, name: str, version: str, source: str = "admin") -> dict:
        self.calls.append(("unload", name, version))
        return {"model": name, "version": version, "load": {"state": "draining"}}

    def rescan(self) -> dict[str, list[str]]:
        return {"loading": [], "unloading": [], "kept": []}

    def loads_view(self) -> dict[str, dict]:
        return {f"tabular:{v}": {"state": "validating"} for _, n, v in self.calls if n == "tabular"}


@pytest.fixture
def parts():
    specs = {"tabular": {}}
    for v in ("1", "2"):
        spec = model_repo.load_spec("tabular", v, os.path.join(ROOT, "models", "tabular", v))
        spec = dataclasses.replace(spec, routing=Routing.parse({"weights": {"1": 100}}))
        specs["tabular"][v] = spec
    specs = ServedVersions(specs)
    workers = Workers()
    now = time.monotonic()
    workers.hello(m.Hello("pre-0", "preprocess", 11), now)
    workers.hello(m.Hello("executor", "executor", 12, failed={"tabular:2": "session: out of memory"}), now)
    workers.hello(m.Hello("post-0", "postprocess", 13), now)
    workers.hello(m.Hello("gateway-http", "gateway", 14), now)
    life, hub, rollout = Lifecycle(), Hub(gone={"post-0"}), Rollout(specs, None, None, Metrics())
    views = Views(breakers=dict, degradation=dict, cache=lambda: None, clients=dict,
                  counts=lambda: {"requests": 0}, pool=dict, routing=dict, drift=dict,
                  direct=lambda: {"images_off": None})
    ops = ClientOps(workers, life, Table(), specs, rollout, StageStats(), Mirror(), hub, views, LOG)
    versions = Versions()
    admin = AdminOps(rollout, Mirror(), versions, workers, specs, LOG, ops.wide_ops())
    return ops, admin, life, hub, versions, rollout


def admin_call(admin: AdminOps, **req) -> dict:
    out = admin.handle(msgpack.packb(req))
    return out.answer if isinstance(out, Pending) else out


def test_health_is_ready_once_the_supervisor_says_so_and_not_while_draining(parts):
    ops, _, life, *_ = parts
    before = ops.health(1)
    assert before["live"] is True and before["ready"] is False and before["started"] is False
    executor = m.ProcessState("executor", 12, True, 2)
    life.on_state(m.ServiceState(True, {"executor": executor}, {"executor": 2}), time.monotonic())
    ready = ops.health(2)
    assert ready["ready"] is True and ready["degraded"] is False and ready["restarts"] == {"executor": 2}
    assert ready["processes"] == {"executor": {"role": "executor", "pid": 12, "alive": True, "restarts": 2}}
    assert ready["failed_models"] == {"tabular:2": "session: out of memory"} and ready["in_flight"] == 2
    life.drain(time.monotonic() + 5)
    draining = ops.health(3)
    assert draining["ready"] is False and draining["draining"] is True and draining["id"] == 3


def test_a_server_wide_change_on_the_client_socket_is_refused_and_changes_nothing(parts):
    ops, _, _, hub, *_ = parts
    root = logging.getLogger()
    before = root.level
    out = ops.handle("log_level", 7, {"level": "DEBUG"})
    assert out["ok"] is False and out["id"] == 7 and out["error"]["code"] == p.PERMISSION_DENIED
    assert "AIENG_CLIENT_ADMIN_OPS" in out["error"]["message"]
    assert hub.sent == [] and root.level == before
    reset = ops.handle("stats", 8, {"reset": True})
    assert reset["ok"] is False and reset["error"]["code"] == p.PERMISSION_DENIED
    assert ops.mirror.resets == 0
    assert ops.handle("stats", 9, {})["ok"] is True  # reading stays open
    ops.client_admin = True  # AIENG_CLIENT_ADMIN_OPS=1: the operator allows it on the client socket
    assert ops.handle("stats", 10, {"reset": True})["ok"] is True and ops.mirror.resets == 1


def test_log_level_reaches_every_connected_process_and_a_bad_level_reaches_none(parts):
    ops, admin, _, hub, *_ = parts
    bad = admin_call(admin, op="log_level", id=7, level="LOUD")
    assert bad["ok"] is False and bad["error"]["code"] == p.INVALID_REQUEST and hub.sent == []
    out = admin_call(admin, op="log_level", id=8, level="DEBUG")
    # post-0's send fails (not connected): it is not listed as told
    assert out["processes"] == ["pre-0", "executor", "gateway-http", "supervisor"]
    assert [(w, msg.level) for w, msg in hub.sent] == [(w, "DEBUG") for w in out["processes"]]
    logging.getLogger().setLevel("WARNING")


def test_a_process_heard_from_after_a_change_gets_that_level(parts):
    ops, admin, _, hub, *_ = parts
    ops.joined("gateway-late")  # no change at run time yet: it keeps the level it started with
    assert hub.sent == []
    admin_call(admin, op="log_level", id=12, level="DEBUG")
    told = len(hub.sent)
    ops.joined("gateway-late")  # said hello only after the change (e.g. just after the start)
    assert [(w, msg.level) for w, msg in hub.sent[told:]] == [("gateway-late", "DEBUG")]
    logging.getLogger().setLevel("WARNING")


def test_log_level_without_a_level_reads_it_and_tells_nobody(parts):
    ops, admin, _, hub, *_ = parts
    root = logging.getLogger()
    before = root.level
    try:
        root.setLevel("ERROR")
        assert ops.handle("log_level", 9, {}) == {"id": 9, "ok": True, "level": "ERROR"}
        admin_call(admin, op="log_level", id=10, level="DEBUG")
        assert ops.handle("log_level", 11, {"level": None}) == {"id": 11, "ok": True, "level": "DEBUG"}
        assert [msg.level for _, msg in hub.sent] == ["DEBUG"] * len(hub.sent) and hub.sent
        assert len(hub.sent) == 4  # the one change, to each connected process; the reads sent nothing
    finally:
        root.setLevel(before)


def test_models_shows_a_failed_load_and_admin_refuses_weight_for_it(parts):
    ops, admin, _, _, _, rollout = parts
    models = ops.handle("models", 1, {})["models"]["tabular"]
    assert models["versions"]["2"]["load_error"] == "session: out of memory"
    assert models["versions"]["1"]["load_error"] is None and models["weights"] == {"1": 100.0}
    out = admin_call(admin, op="set_weights", id=5, model="tabular", weights={"1": 50, "2": 50})
    assert out["ok"] is False and out["id"] == 5 and out["error"]["code"] == p.INVALID_REQUEST
    assert "not loaded (session: out of memory)" in out["error"]["message"]
    assert rollout.weights("tabular")[1] == {"1": 100.0}  # nothing changed


def test_admin_load_and_unload_go_to_the_version_manager_and_show_in_status(parts):
    _, admin, _, _, versions, _ = parts
    out = admin_call(admin, op="load", id=1, model="tabular", version=3)
    assert out["ok"] is True and out["load"]["state"] == "validating"
    assert admin_call(admin, op="unload", id=2, model="tabular", version="2")["ok"] is True
    assert versions.calls == [("load", "tabular", "3"), ("unload", "tabular", "2")]
    status = admin_call(admin, op="status", id=3, model="tabular")
    loads = status["models"]["tabular"]["loads"]
    assert loads == {"3": {"state": "validating"}, "2": {"state": "validating"}}
    bad = admin_call(admin, op="load", id=4, model="tabular")
    assert bad["ok"] is False and bad["error"]["code"] == p.INVALID_REQUEST and len(versions.calls) == 2


def test_admin_refuses_what_is_not_a_request(parts):
    _, admin, *_ = parts
    assert admin.handle(b"\xc1")["error"]["code"] == p.INVALID_REQUEST  # not msgpack
    assert "must be a msgpack map" in admin.handle(msgpack.packb([1, 2]))["error"]["message"]
    unknown = admin_call(admin, op="explode", id=9)
    assert unknown["id"] == 9 and unknown["error"]["code"] == p.INVALID_REQUEST
    assert "set_weights" in unknown["error"]["message"]
    missing = admin_call(admin, op="set_weights", id=10, model="nope", weights={"1": 100})
    assert missing["error"]["code"] == p.MODEL_NOT_FOUND
