"""The shadow mirror against fakes: it needs what its constructor names, nothing of the frontend.

A primary admitted for a model with a shadow at 100% gets a copy once it is answered; the copy is started
pinned to the candidate, never answered to a client; its answer is compared with the primary's.  A
primary that failed, or one answered while the candidate is refused (failed load, draining) or the table
is at the shadow's load cap, sheds its copy.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from aieng.config import Config
from aieng.frontend.requests.table import SHADOW, Request
from aieng.frontend.rollout.mirror import Mirror
from aieng.models.routing import ShadowConfig
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p


class Table:
    def __init__(self, size: int = 0):
        self.size, self.rids = size, iter(range(1000, 2000))

    def __len__(self) -> int:
        return self.size

    def new_rid(self) -> int:
        return next(self.rids)


class Admission:
    def __init__(self, refused: set[str] = frozenset()):
        self.refused = refused

    def refuses(self, key: str) -> bool:
        return key in self.refused


def rig(table_size: int = 0, refused: set[str] = frozenset()):
    started: list[Request] = []
    specs = ServedVersions({"tabular": {"1": SimpleNamespace(timeout_ms=0),
                                        "2": SimpleNamespace(timeout_ms=0)}})
    rollout = SimpleNamespace(shadow_of=lambda model: ShadowConfig("2", 100.0, 0.5, 0))
    mirror = Mirror(Config(max_inflight=10), specs, rollout, Admission(refused), Table(table_size),
                    started.append, CollectorRegistry())
    return mirror, started


def primary(rid: int = 7) -> Request:
    now = time.monotonic()
    return Request(rid, [b"client"], rid, "tabular", "1", now + 5, now, {})


ANSWER = p.pack({"label": "Adelie"})


def test_an_answered_primary_gets_a_pinned_copy_and_its_answer_is_compared():
    mirror, started = rig()
    req = primary()
    mirror.after_admit(req, b"the client's frame")
    assert started == []  # the copy waits for the primary's answer: a shadow never delays it
    mirror.primary_end(req, ANSWER, time.monotonic())
    [copy] = started
    assert (copy.kind, copy.version, copy.route, copy.link, copy.body) == (
        SHADOW, "2", "shadow", 7, b"the client's frame")
    mirror.shadow_end(copy, ANSWER, "", time.monotonic())
    view = mirror.view("tabular")["2"]
    assert (view["pairs"], view["label_pairs"], view["agreement"]) == (1, 1, 1.0)


def test_a_failed_primary_or_a_refused_candidate_or_a_full_table_sheds_the_copy():
    outcomes = []
    for table_size, refused, outputs in ((0, set(), None), (0, {"tabular:2"}, ANSWER), (5, set(), ANSWER)):
        mirror, started = rig(table_size, refused)
        req = primary()
        mirror.after_admit(req, b"frame")
        mirror.primary_end(req, outputs, time.monotonic())
        assert started == []
        outcomes.append({k: v for k, v in mirror.view("tabular")["2"]["outcomes"].items() if v})
    assert outcomes == [{"primary_failed": 1}, {"shed": 1}, {"shed": 1}]
