"""What keeps a run-time load from delaying requests: a preprocess worker building a version is out of
the rotation while another can serve (``Workers.resting``), and builds only after the tasks that came
in the same drain (``Versions(defer=True)``)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from aieng import messages as m
from aieng.frontend.workers import Workers
from aieng.worker_hotswap import Versions
from tests.unit.demo import needs_demo_models
from tests.unit.demo import spec as demo_spec


def two_preprocess_workers() -> Workers:
    w = Workers()
    for i, name in enumerate(("pre-0", "pre-1")):
        w.hello(m.Hello(name, "preprocess", 100 + i), now=0.0)
    return w


def test_a_resting_worker_is_not_picked_while_another_is_live():
    w = two_preprocess_workers()
    w.resting.add("pre-0")
    assert {w.pick("preprocess", 1.0, lambda n: 0) for _ in range(6)} == {"pre-1"}


def test_when_every_worker_rests_one_is_picked_all_the_same():
    w = two_preprocess_workers()
    w.resting.update({"pre-0", "pre-1"})
    assert {w.pick("preprocess", 1.0, lambda n: 0) for _ in range(6)} == {"pre-0", "pre-1"}


@needs_demo_models
def test_a_deferred_load_is_built_after_the_drain_not_when_it_arrives():
    order: list[str] = []
    sent: list = []
    worker = SimpleNamespace(handlers={}, worker="pre-0", role="preprocess", log=logging.getLogger("t"),
                             info=dict, send=lambda msg: sent.append(msg))
    v = Versions(worker, {}, {}, build=lambda spec: order.append(f"build {spec.key}") or object(), defer=True)
    spec = demo_spec("tabular")
    worker.handlers[m.LoadVersion](m.LoadVersion(spec.to_dict()), [])
    order.append("tasks of the drain")
    assert sent == []  # nothing built or answered yet
    v.build_deferred()
    assert order == ["tasks of the drain", f"build {spec.key}"]
    assert [type(x).__name__ for x in sent] == ["VersionLoaded"] and sent[0].key == spec.key
