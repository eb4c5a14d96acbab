"""Unit tests for the two slot size classes of ``shm.Ring`` (small slots beside big ones, issue 13).

A ring with ``nsmall`` small slots gives a request a slot of the smallest class it fits and never one
of the other class: a page tensor cannot take a crop's slot, crops cannot take every page slot.
"""
from __future__ import annotations

import os
import random

import numpy as np
import pytest

from aieng.wire import shm

SMALL, BIG = 4096, 3 * 4096


@pytest.fixture
def ring():
    inst = str(random.randrange(10**12, 10**13))  # never a real instance (pid_max <= 2**22)
    r = shm.Ring.create(shm.segment_name(inst, "classes", 1), 5, BIG, nsmall=3, small_bytes=SMALL)
    yield r
    r.close()
    r.seg.unlink()
    assert shm.list_segments(inst) == []


def test_each_request_takes_a_slot_of_its_own_class(ring):
    assert (ring.nslots, ring.nsmall, ring.small_bytes, ring.slot_bytes) == (5, 3, SMALL, BIG)
    small = [ring.alloc(100) for _ in range(3)]
    assert [s[0] for s in small] == [0, 1, 2]
    assert ring.alloc(SMALL) is None  # the small class is full: no big slot is taken for it
    big = [ring.alloc(SMALL + 1) for _ in range(2)]
    assert [s[0] for s in big] == [3, 4]
    assert ring.alloc(BIG) is None  # the big class is full
    ring.free(*small[1])
    assert ring.alloc(BIG) is None and ring.alloc(1)[0] == 1


def test_small_requests_never_wait_for_big_slots(ring):
    held = [ring.alloc(BIG) for _ in range(2)]  # pages hold every big slot
    assert all(h is not None for h in held)
    assert ring.alloc(SMALL) is not None  # a crop still gets one


def test_payload_bytes_picks_the_class_write_needs(ring):
    fits = [("a", np.ones(4000, np.uint8))]
    over = [("a", np.ones(4040, np.uint8)), ("b", np.ones(64, np.uint8))]  # 4096 (aligned) + 64 > 4096
    assert shm.payload_bytes(fits) <= SMALL < shm.payload_bytes(over)
    slot, _ = ring.alloc(shm.payload_bytes(over))
    assert slot >= ring.nsmall
    descs = ring.write(slot, over)
    assert ring.views(slot, descs)["b"].sum() == 64


def test_slots_of_both_classes_are_disjoint_and_read_back(ring):
    written = {}
    for i, n in enumerate((SMALL, SMALL, SMALL, BIG, BIG)):
        slot, _ = ring.alloc(n)
        arr = np.full(n // 8, i, np.float64)
        written[slot] = (ring.write(slot, [("x", arr)]), i)
    attached = shm.Ring(shm.Segment(ring.seg.name))  # a consumer sees the same classes
    try:
        assert (attached.nsmall, attached.small_bytes) == (3, SMALL)
        for slot, (descs, i) in written.items():
            assert np.all(attached.views(slot, descs)["x"] == i)
    finally:
        attached.close()
    spans = sorted(ring.where(s) for s in range(ring.nslots))
    assert spans[0][0] == ring.data_start
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert spans[-1][0] + spans[-1][1] == os.stat(ring.seg.path).st_size


def test_a_small_slot_refuses_a_big_payload(ring):
    slot, _ = ring.alloc(1)
    with pytest.raises(OverflowError):
        ring.write(slot, [("x", np.ones(SMALL + 1, np.uint8))])


def test_a_ring_of_one_size_has_no_small_class():
    inst = str(random.randrange(10**12, 10**13))
    r = shm.Ring.create(shm.segment_name(inst, "one", 1), 2, SMALL)
    try:
        assert r.nsmall == 0 and r.alloc(0)[0] == 0 and r.alloc(SMALL)[0] == 1 and r.alloc(1) is None
    finally:
        r.close()
        r.seg.unlink()


@pytest.mark.parametrize("nsmall,small", [(5, SMALL), (-1, SMALL), (2, BIG + 4096)])
def test_bad_classes_are_refused(nsmall, small):
    inst = str(random.randrange(10**12, 10**13))
    with pytest.raises(ValueError):
        shm.Ring.create(shm.segment_name(inst, "bad", 1), 5, BIG, nsmall=nsmall, small_bytes=small)
    assert shm.list_segments(inst) == []
