"""Unit tests for aieng/wire/shm.py: slot rings over POSIX shared memory.

Every segment is named ``aieng.<instance>.<worker>.<pid>`` with an instance id
far outside the pid range, so nothing here can collide with a running server;
each test's segments are unlinked in teardown and the teardown asserts that
nothing with the test's prefix is left in /dev/shm.
"""
from __future__ import annotations

import os
import random
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng.wire import shm


def _new_instance() -> str:
    # pid_max is at most 2**22 on Linux, so this never names a real instance.
    return str(random.randrange(10**12, 10**13))


@pytest.fixture
def instance():
    inst = _new_instance()
    yield inst
    left = shm.list_segments(inst)
    shm.unlink_prefix(f"{shm.PREFIX}{inst}.")  # safety net, then complain
    assert left == [], f"test left segments behind: {left}"
    assert not [n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"{shm.PREFIX}{inst}.")]


@pytest.fixture
def make_ring(instance):
    """Factory: create a ring for ``worker``; closed and unlinked at teardown."""
    made: list[shm.Ring] = []

    def make(worker: str = "pre0", nslots: int = 4, slot_bytes: int = 4096, lease_s: float = 600.0,
             pid: int = 1) -> shm.Ring:
        ring = shm.Ring.create(shm.segment_name(instance, worker, pid), nslots, slot_bytes, lease_s=lease_s)
        made.append(ring)
        return ring

    yield make
    for ring in made:
        if ring.seg.mm is not None:
            ring.close()
        ring.seg.unlink()


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def monotonic(self) -> float:
        return self.t


# ---------------------------------------------------------------- round trip
CASES = [
    ("f32", np.arange(6, dtype=np.float32).reshape(2, 3) / 7),
    ("i64", np.array([-(2**62), -1, 0, 1, 2**62], dtype=np.int64)),
    ("u8", np.arange(60, dtype=np.uint8).reshape(3, 4, 5)),  # 60 bytes: next offset must round up
    ("b", np.array([True, False, True, True, False, False, True])),
    ("scalar", np.array(3.5, dtype=np.float16)),  # 0-d
    ("empty", np.zeros((0, 4), dtype=np.float64)),
    ("be", np.arange(5, dtype=">i4")),  # big-endian stays big-endian in its descriptor
    ("strided", np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2]),  # non-contiguous source
]


def test_round_trip_dtypes_shapes_and_alignment(make_ring):
    ring = make_ring(nslots=3, slot_bytes=8192)
    slot, gen = ring.alloc()
    descs = ring.write(slot, CASES)

    assert [d[0] for d in descs] == [name for name, _ in CASES]
    end = 0
    for (name, arr), (dname, dtype, shape, off) in zip(CASES, descs):
        assert off % shm.ALIGN == 0, f"{name} at unaligned offset {off}"
        assert off >= end, "tensors overlap"
        end = off + arr.nbytes
        assert np.dtype(dtype) == arr.dtype and shape == list(arr.shape)

    views = ring.views(slot, descs)
    for name, arr in CASES:
        v = views[name]
        assert v.dtype == arr.dtype and v.shape == arr.shape
        np.testing.assert_array_equal(v, arr)
        if v.nbytes:
            assert v.ctypes.data % shm.ALIGN == 0, f"{name} view not 64-byte aligned in memory"
    assert ring.free(slot, gen)
    assert ring.in_use() == 0


def test_slots_do_not_overlap(make_ring):
    ring = make_ring(nslots=3, slot_bytes=4096)
    refs = []
    for k in range(3):
        slot, gen = ring.alloc()
        refs.append((slot, gen, ring.write(slot, [("x", np.full(1024, k, dtype=np.int32))])))
    assert sorted(r[0] for r in refs) == [0, 1, 2]
    for k, (slot, _, descs) in enumerate(refs):
        assert np.all(ring.views(slot, descs)["x"] == k)


@settings(max_examples=40, deadline=None)
@given(arrays=st.lists(
    st.tuples(st.sampled_from(["<f4", "<f8", "<i8", "<i4", "|u1", "|b1", "<f2", "<i2", ">f8"]),
              st.lists(st.integers(0, 5), max_size=3)),
    min_size=1, max_size=6))
def test_round_trip_property(arrays):
    inst = _new_instance()
    ring = shm.Ring.create(shm.segment_name(inst, "prop", 1), 1, 16384)
    try:
        rng = np.random.default_rng(0)
        tensors = []
        for i, (dt, shape) in enumerate(arrays):
            raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dt).itemsize, dtype=np.uint8)
            tensors.append((f"t{i}", raw.view(dt).reshape(shape)))
        slot, gen = ring.alloc()
        descs = ring.write(slot, tensors)
        assert all(d[3] % shm.ALIGN == 0 for d in descs)
        views = ring.views(slot, descs)
        for name, arr in tensors:
            assert views[name].shape == arr.shape and views[name].dtype == arr.dtype
            assert views[name].tobytes() == arr.tobytes()
        del views
        assert ring.free(slot, gen)
    finally:
        ring.close()
        ring.seg.unlink()
    assert shm.list_segments(inst) == []


# ---------------------------------------------------------------- slot life
def test_stale_free_is_a_noop(make_ring):
    ring = make_ring(nslots=1)
    slot, gen1 = ring.alloc()
    assert ring.free(slot, gen1)
    assert not ring.free(slot, gen1), "double free must be a no-op"

    slot2, gen2 = ring.alloc()
    assert slot2 == slot and gen2 == gen1 + 1
    assert not ring.free(slot, gen1), "a free with an old generation must not free the new holder's slot"
    assert ring.state[slot] == shm.BUSY and ring.in_use() == 1
    assert not ring.free(slot, gen2 + 1)
    assert not ring.free(-1, gen2) and not ring.free(1, gen2)  # out of range
    assert ring.free(slot, gen2)


def test_full_ring_alloc_returns_none(make_ring):
    ring = make_ring(nslots=3)
    got = [ring.alloc() for _ in range(3)]
    assert sorted(s for s, _ in got) == [0, 1, 2]
    assert ring.alloc() is None and ring.alloc() is None
    assert ring.in_use() == 3
    slot, gen = got[1]
    assert ring.free(slot, gen)
    again = ring.alloc()
    assert again is not None and again[0] == slot and again[1] == gen + 1


def test_lease_reclaim_frees_stale_busy_slots(make_ring, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(shm, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    ring = make_ring(nslots=2, lease_s=0.001)
    a = ring.alloc()
    b = ring.alloc()
    clock.t += 0.0005  # still within the lease
    assert ring.alloc() is None
    assert ring.reclaim() == 0

    clock.t += 1.0  # both holders "died" long ago
    c = ring.alloc()  # full -> reclaim -> a slot
    assert c is not None and c[0] == a[0] and c[1] == a[1] + 1
    assert ring.in_use() == 1, "reclaim frees every stale slot, alloc takes one"
    # The dead holder's late frees must not touch the new allocation.
    assert not ring.free(*a)
    assert not ring.free(*b)  # b was reclaimed: already FREE
    assert ring.state[c[0]] == shm.BUSY
    assert ring.free(*c)


def test_reclaim_leaves_fresh_slots(make_ring, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(shm, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    ring = make_ring(nslots=3, lease_s=10.0)
    old = ring.alloc()
    clock.t += 8.0
    new = ring.alloc()
    clock.t += 5.0  # old is 13 s into its lease, new only 5 s
    assert ring.reclaim() == 1
    assert ring.state[old[0]] == shm.FREE and ring.state[new[0]] == shm.BUSY


def test_overflow_when_tensors_exceed_a_slot(make_ring):
    ring = make_ring(nslots=1, slot_bytes=1000)
    assert ring.slot_bytes == 4096, "slot size is rounded up to a page"
    slot, gen = ring.alloc()
    ring.write(slot, [("x", np.zeros(4096, np.uint8))])  # exactly one slot fits
    with pytest.raises(OverflowError):
        ring.write(slot, [("x", np.zeros(4097, np.uint8))])
    # 4000 bytes, then alignment puts the next tensor at 4032: 4032 + 100 > 4096.
    with pytest.raises(OverflowError):
        ring.write(slot, [("a", np.zeros(4000, np.uint8)), ("b", np.zeros(100, np.uint8))])
    ring.write(slot, [("a", np.zeros(4000, np.uint8)), ("b", np.zeros(64, np.uint8))])
    assert ring.free(slot, gen)


def test_overflow_does_not_spill_into_next_slot(make_ring):
    ring = make_ring(nslots=2, slot_bytes=4096)
    s0, _ = ring.alloc()
    s1, _ = ring.alloc()
    d1 = ring.write(s1, [("x", np.full(16, 7, np.uint8))])
    with pytest.raises(OverflowError):
        ring.write(s0, [("a", np.full(4090, 1, np.uint8)), ("b", np.full(64, 9, np.uint8))])
    assert np.all(ring.views(s1, d1)["x"] == 7)


# ---------------------------------------------------------------- layout
@pytest.mark.parametrize("nslots", [1, 7, 512, 4097, 65536])
def test_header_layout_fits_and_is_page_aligned(nslots):
    hb = shm.header_bytes(nslots)
    assert hb % 4096 == 0
    state_end = shm.FIXED + nslots
    gen_start = (state_end + 7) & ~7
    leased_start = (gen_start + 4 * nslots + 7) & ~7
    assert leased_start + 8 * nslots <= hb


def test_header_arrays_are_disjoint(make_ring):
    ring = make_ring(nslots=7)
    base = ring.seg.buf.ctypes.data
    spans = sorted((a.ctypes.data - base, a.ctypes.data - base + a.nbytes)
                   for a in (ring.state, ring.gen, ring.leased))
    assert spans[0][0] >= shm.FIXED
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(2))
    assert spans[-1][1] <= ring.data_start
    assert ring.gen.ctypes.data % 4 == 0 and ring.leased.ctypes.data % 8 == 0


def test_bad_names_and_sizes(instance, make_ring):
    with pytest.raises(ValueError):
        shm.Segment("notaieng.1.x.2")
    with pytest.raises(ValueError):
        shm.Segment(f"{shm.PREFIX}{instance}/../x")
    with pytest.raises(ValueError):
        shm.Ring.create(shm.segment_name(instance, "w", 1), 0, 4096)
    with pytest.raises(ValueError):
        shm.Ring.create(shm.segment_name(instance, "w", 1), 65537, 4096)
    assert shm.list_segments(instance) == []  # nothing created by the refusals
    ring = make_ring("dup")
    with pytest.raises(FileExistsError):
        shm.Ring.create(ring.seg.name, 4, 4096)


def test_attach_to_non_ring_segment_refused(instance):
    seg = shm.Segment(shm.segment_name(instance, "junk", 1), 8192, create=True)
    try:
        with pytest.raises(ValueError, match="not an aieng ring"):
            shm.Ring(shm.Segment(seg.name))
        cache = shm.RingCache()
        assert cache.free(seg.name, 0, 1) is False
        cache.close()
    finally:
        seg.close()
        seg.unlink()


# ---------------------------------------------------------------- consumers
def test_ring_cache_attach_sees_bytes_and_free_reaches_owner(make_ring):
    owner = make_ring("pre0", nslots=2)
    slot, gen = owner.alloc()
    data = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    descs = owner.write(slot, [("x", data)])

    cache = shm.RingCache()
    try:
        attached = cache.get(owner.seg.name)
        assert attached is not owner and cache.get(owner.seg.name) is attached  # cached
        assert (attached.nslots, attached.slot_bytes) == (owner.nslots, owner.slot_bytes)
        view = attached.views(slot, descs)["x"]
        np.testing.assert_array_equal(view, data)

        owner.views(slot, descs)["x"][0, 0] = 42.0  # same memory, not a copy
        assert view[0, 0] == 42.0
        del view

        assert not cache.free(owner.seg.name, slot, gen + 1)  # wrong generation
        assert owner.state[slot] == shm.BUSY
        assert cache.free(owner.seg.name, slot, gen)
        assert owner.state[slot] == shm.FREE and owner.in_use() == 0
        assert not cache.free(owner.seg.name, slot, gen)  # stale
        # The owner's next allocation is visible to the consumer too.
        s2, g2 = owner.alloc()
        assert attached.state[s2] == shm.BUSY and int(attached.gen[s2]) == g2
        assert owner.free(s2, g2)
    finally:
        cache.close()
    assert cache.rings == {}


def test_ring_cache_free_of_vanished_segment_is_false(instance):
    cache = shm.RingCache()
    assert cache.free(shm.segment_name(instance, "gone", 9), 0, 1) is False
    assert cache.rings == {}


def test_ring_cache_lru_limit_and_forget(make_ring, instance):
    rings = [make_ring(f"pre{i}") for i in range(3)]
    cache = shm.RingCache(limit=2)
    try:
        for r in rings:
            cache.get(r.seg.name)
        assert list(cache.rings) == [rings[1].seg.name, rings[2].seg.name]
        cache.get(rings[1].seg.name)  # touch: now most recent
        cache.get(rings[0].seg.name)  # evicts pre2
        assert list(cache.rings) == [rings[1].seg.name, rings[0].seg.name]
        cache.forget(f"{shm.PREFIX}{instance}.pre1.")
        assert list(cache.rings) == [rings[0].seg.name]
    finally:
        cache.close()


# ---------------------------------------------------------------- cleanup
def test_clean_stale_removes_only_dead_instances(make_ring):
    dead, live = _new_instance(), _new_instance()
    made = []
    try:
        for inst, worker in [(dead, "pre0"), (dead, "executor"), (live, "pre0")]:
            r = shm.Ring.create(shm.segment_name(inst, worker, 77), 1, 4096)
            r.close()
            made.append(r)
        gone = shm.clean_stale(alive=lambda pid: pid != int(dead))  # everyone else "alive"
        assert sorted(gone) == sorted(shm.segment_name(dead, w, 77) for w in ("pre0", "executor"))
        assert shm.list_segments(dead) == []
        assert shm.list_segments(live) == [shm.segment_name(live, "pre0", 77)]
    finally:
        for r in made:
            r.seg.unlink()
    assert shm.list_segments(dead) == [] and shm.list_segments(live) == []


def test_unlink_prefix(instance):
    names = [shm.segment_name(instance, w, 5) for w in ("pre0", "pre01", "executor")]
    for n in names:
        shm.Segment(n, 4096, create=True).close()
    assert shm.list_segments(instance) == sorted(names)
    assert shm.unlink_prefix(f"{shm.PREFIX}{instance}.pre0.") == [names[0]]
    assert shm.list_segments(instance) == sorted(names[1:])
    assert sorted(shm.unlink_prefix(f"{shm.PREFIX}{instance}.")) == sorted(names[1:])
    assert shm.unlink_prefix(f"{shm.PREFIX}{instance}.") == []


def test_holds_tells_a_live_slot_from_a_freed_or_reused_one(tmp_path):
    ring = shm.Ring.create(f"aieng.{os.getpid()}9.holds.1", 2, 4096)
    try:
        slot, gen = ring.alloc()
        assert ring.holds(slot, gen)
        assert ring.free(slot, gen)
        assert not ring.holds(slot, gen)  # freed
        again = ring.alloc()
        assert again == (slot, gen + 1)
        assert not ring.holds(slot, gen)  # reused under a new generation
        assert ring.holds(*again)
        assert not ring.holds(99, gen)
    finally:
        ring.close()
        ring.seg.unlink()


def test_segments_named_with_our_own_pid_are_stale_at_start():
    """In a container the supervisor is PID 1 every time: segments named after our pid, found before we
    made any, are a previous incarnation's and must go (the pod's /dev/shm outlives a container)."""
    from aieng.runtime.instance import _instance_alive

    mine = str(os.getpid())
    r = shm.Ring.create(shm.segment_name(mine, "pre-0", 10), 1, 4096)
    r.close()
    try:
        gone = shm.clean_stale(_instance_alive)
        assert shm.segment_name(mine, "pre-0", 10) in gone
        assert shm.list_segments(mine) == []
    finally:
        shm.unlink_prefix(f"{shm.PREFIX}{mine}.")
