"""The /dev/shm budget: computed exactly as the rings are created, checked against real free space."""
import os

import pytest

from aieng.config import Config
from aieng.wire import shm, shmsize


def test_ring_bytes_is_the_size_ring_create_gives_the_segment():
    name = shm.segment_name("0", "shmsize-test", os.getpid())
    ring = shm.Ring.create(name, 7, 5000)  # 5000 is rounded up to a page, as the rings do
    try:
        assert os.stat(ring.seg.path).st_size == shmsize.ring_bytes(7, 5000)
    finally:
        ring.close()
        ring.seg.unlink()


def test_needed_bytes_counts_every_producer_plus_one_restarting_ring():
    cfg = Config(preprocess_workers=3, max_inflight=100, shm_slots=0, shm_slot_bytes=1 << 20)
    one = shm.header_bytes(100) + 100 * (1 << 20)
    assert shmsize.producers(cfg) == 4  # 3 preprocess workers + the executor
    assert shmsize.needed_bytes(cfg) == 5 * one
    assert shmsize.needed_mib(cfg) == -(-5 * one // (1 << 20))


def test_shm_slots_overrides_max_inflight():
    cfg = Config(preprocess_workers=1, max_inflight=256, shm_slots=8, shm_slot_bytes=4096)
    assert shmsize.needed_bytes(cfg) == 3 * (shm.header_bytes(8) + 8 * 4096)


def test_describe_names_the_size_in_mib():
    cfg = Config(preprocess_workers=2, max_inflight=256, shm_slot_bytes=1 << 20)
    assert shmsize.describe(cfg).startswith("shared memory needed: 1025 MiB (3 rings + 1 for a restart")


def test_check_passes_when_the_directory_has_room(tmp_path):
    cfg = Config(preprocess_workers=1, shm_slots=1, shm_slot_bytes=4096)  # 3 x 8 KiB
    shmsize.check(cfg, str(tmp_path))


def test_check_refuses_with_the_size_and_the_remedies(tmp_path):
    cfg = Config(preprocess_workers=1, shm_slots=65536, shm_slot_bytes=1 << 30)  # 192 TiB: never free
    n = shmsize.needed_mib(cfg)
    with pytest.raises(shmsize.ShmTooSmall) as err:
        shmsize.check(cfg, str(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg
    assert f"--shm-size={n}m" in msg and f"sizeLimit: {n}Mi" in msg and str(tmp_path) in msg


def test_grown_slots_keep_the_ring_within_the_configured_bytes():
    cfg = Config()  # 256 slots x 1 MiB
    assert shmsize.ring_shape(cfg, 1000) == (256, 1 << 20, 0)
    assert shmsize.ring_shape(cfg, 1000, small_requests=True) == (256, 1 << 20, 0)  # one size: one class
    slots, slot, small = shmsize.ring_shape(cfg, 36_000_000)  # textdet's largest page tensor
    assert (slots, slot, small) == (7, 36_000_000, 0)
    assert slots * slot <= cfg.ring_slots * cfg.shm_slot_bytes
    assert shmsize.ring_shape(cfg, 200_000_000)[0] == shmsize.MIN_SLOTS  # never fewer than 4


def test_small_requests_get_their_own_slots_within_the_same_bytes():
    cfg = Config()  # 256 slots x 1 MiB
    slots, slot, small = shmsize.ring_shape(cfg, 36_000_064, small_requests=True)  # textdet beside textrec
    assert (slots - small, small) == (4, 118)  # 4 page slots, 118 crop slots (one class: 7 for both)
    got = shmsize.ring_bytes(slots, slot, small, cfg.shm_slot_bytes)
    assert got <= shmsize.ring_bytes(cfg.ring_slots, cfg.shm_slot_bytes)  # what needed_bytes counts


@pytest.mark.parametrize("need", [(1 << 20) + 1, 3_000_000, 14_970_880, 36_000_064, 63 << 20])
@pytest.mark.parametrize("slots", [5, 8, 64, 256, 1000])
def test_two_classes_stay_within_the_figure_and_keep_both_minimums(need, slots):
    cfg = Config(shm_slots=slots, shm_slot_bytes=1 << 20)
    n, slot, small = shmsize.ring_shape(cfg, need, small_requests=True)
    assert n <= cfg.ring_slots and slot == need
    assert min(small, n - small) >= min(shmsize.MIN_SLOTS, slots - shmsize.MIN_SLOTS)
    if need * shmsize.MIN_SLOTS + shmsize.MIN_SLOTS * (1 << 20) <= slots * (1 << 20):
        assert (shmsize.ring_bytes(n, slot, small, cfg.shm_slot_bytes)
                <= shmsize.ring_bytes(cfg.ring_slots, cfg.shm_slot_bytes))


def test_ring_bytes_with_classes_is_the_size_ring_create_gives_the_segment():
    name = shm.segment_name("0", "shmsize-classes", os.getpid())
    ring = shm.Ring.create(name, 9, 50_000, nsmall=6, small_bytes=5000)
    try:
        assert os.stat(ring.seg.path).st_size == shmsize.ring_bytes(9, 50_000, 6, 5000)
    finally:
        ring.close()
        ring.seg.unlink()
