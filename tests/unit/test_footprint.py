"""Issue 20, finding 15 below the server: a build's footprint is reported only when it was its own
(``footprint.Quiet``, ``Versions``): no other build and no unload overlapped it."""
from __future__ import annotations

import dataclasses
import logging
import mmap
import threading
from types import SimpleNamespace

from aieng.runtime.footprint import Quiet
from aieng.runtime.worker_hotswap import Versions
from aieng.wire import messages as m
from tests.unit.demo import needs_demo_models, spec
from tests.waits import until


def test_a_window_alone_is_quiet_and_overlapping_ones_are_not():
    q = Quiet()
    assert q.end(q.begin())  # alone from start to end
    first = q.begin()
    second = q.begin()  # began while the first was open
    assert not q.end(first) and not q.end(second)
    alone = q.begin()
    with q.moving():  # an unload meanwhile
        pass
    assert not q.end(alone)
    with q.moving():
        during = q.begin()  # began while memory was moving
    assert not q.end(during)
    assert q.end(q.begin())  # and quiet again afterwards


def loader(role: str = "executor"):
    sent: list = []
    worker = SimpleNamespace(handlers={}, worker=role, role=role, log=logging.getLogger("t"),
                             send=lambda msg: sent.append(msg), hello_msg=lambda: m.Hello(role, role, 1))
    return worker, sent


def grow(nbytes: int, keep: list):
    """What a build holds: ``nbytes`` of fresh, written pages."""
    block = mmap.mmap(-1, nbytes)
    block.write(b"x" * nbytes)
    keep.append(block)
    return block


@needs_demo_models
def test_concurrent_builds_report_no_footprint_and_a_build_alone_reports_its_own():
    """Three 32 MiB builds on three threads each read the others' growth too (96+ MiB): not reported."""
    worker, sent = loader()
    held: list = []
    started, go = threading.Barrier(3), threading.Event()

    def build(s, urgent):
        block = grow(32 << 20, held)
        started.wait(10)  # all three are under way together
        go.wait(10)
        return block

    v = Versions(worker.worker, worker.send, lambda: None, worker.log, {}, {}, build, background=True,
                 gpu=worker.role == "executor")
    worker.handlers.update(v.handlers)
    base = spec("tabular")
    specs = [dataclasses.replace(base, version=str(i)) for i in (1, 2, 3)]
    for s in specs:
        worker.handlers[m.LoadVersion](m.LoadVersion(s), [])
    go.set()
    until(lambda: v.poll() or len(sent) == 3, 10)
    assert sorted((x.key, x.footprint_bytes) for x in sent) == [(s.key, 0) for s in specs]

    sent.clear()
    v.build = lambda s, urgent: grow(32 << 20, held)
    worker.handlers[m.LoadVersion](m.LoadVersion(dataclasses.replace(base, version="4")), [])
    until(lambda: v.poll() or sent, 10)
    assert [x.key for x in sent] == ["tabular:4"]
    assert 32 << 20 <= sent[0].footprint_bytes < 48 << 20, sent[0].footprint_bytes
