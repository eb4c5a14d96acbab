"""How much ``/dev/shm`` the configured rings need, and the start-time check against it.

Contract:
  * ``needed_bytes(cfg)``: the shared memory one instance may hold at once: one ring per producer
    (each preprocess worker and the executor), each ``header_bytes(ring_slots) + ring_slots *
    shm_slot_bytes`` (page-rounded as ``shm.Ring.create`` does), plus ``RESTART_RINGS`` more for a
    restarted producer whose dead ring consumers may still map.
  * ``ring_shape``: a producer whose largest request or output is bigger than ``AIENG_SHM_SLOT_BYTES``
    gets fewer, bigger slots in the same bytes (at least ``MIN_SLOTS``); one that also has small
    requests gets two size classes in those bytes (at least ``MIN_SLOTS`` each), so pages never starve
    crops.  The figure holds for big slots up to about ``ring_slots * shm_slot_bytes / MIN_SLOTS``.
  * ``check(cfg, path)`` compares with the free space at ``path`` (default ``shm.SHM_DIR``) and raises
    ``ShmTooSmall`` with one line naming the size and how to grant it.  tmpfs allocates only touched
    pages, but a write into a page that no longer fits is SIGBUS: the space must be there first.
  Sizes and examples: docs/operations.md, 'Shared memory'.
"""
from __future__ import annotations

import os

from aieng.config import Config
from aieng.wire import shm

RESTART_RINGS = 1  # one producer restarting at a time: its old segment may still be mapped
MIN_SLOTS = 4  # a ring with grown slots keeps at least this many
MIB = 1 << 20


class ShmTooSmall(ValueError):
    """``/dev/shm`` has less free space than the rings need."""


def ring_bytes(nslots: int, slot_bytes: int, nsmall: int = 0, small_bytes: int = 0) -> int:
    """Bytes of one ring segment, as ``shm.Ring.create`` sizes it (``nsmall`` of the slots small)."""
    return (shm.header_bytes(nslots) + nsmall * shm.page_round(small_bytes)
            + (nslots - nsmall) * shm.page_round(slot_bytes))


def ring_shape(cfg: Config, need_bytes: int, small_requests: bool = False) -> tuple[int, int, int]:
    """``(slots, slot_bytes, small slots)`` of a producer ring whose models' largest request or output is
    ``need_bytes``: the configured slots of ``AIENG_SHM_SLOT_BYTES``, or, when a model needs bigger slots,
    as many of those as the same bytes hold (never fewer than ``MIN_SLOTS``).  Measured reason: textdet's
    largest page tensor is 36 MB, and 256 such slots per preprocess worker made an 8.6 GiB ring whose
    pages tmpfs keeps once touched.  With ``small_requests`` (some model's requests fit the configured
    size) the bytes are split into two classes (module docstring): at the defaults and textdet beside
    textrec, 4 slots of 36 MB and 118 of 1 MiB, where one class had 7 slots for pages and crops alike."""
    slot = max(cfg.shm_slot_bytes, need_bytes)
    if slot == cfg.shm_slot_bytes:
        return cfg.ring_slots, slot, 0
    budget = cfg.ring_slots * shm.page_round(cfg.shm_slot_bytes)
    if not small_requests or cfg.ring_slots <= MIN_SLOTS:
        return min(cfg.ring_slots, max(MIN_SLOTS, budget // shm.page_round(slot))), slot, 0
    nbig = min(cfg.ring_slots - 1, max(MIN_SLOTS, budget // 2 // shm.page_round(slot)))
    rest = max(0, budget - nbig * shm.page_round(slot)) // shm.page_round(cfg.shm_slot_bytes)
    nsmall = min(cfg.ring_slots - nbig, max(MIN_SLOTS, rest))
    return nbig + nsmall, slot, nsmall


def producers(cfg: Config) -> int:
    """Processes that own a ring: every preprocess worker and the executor."""
    return cfg.preprocess_workers + 1


def needed_bytes(cfg: Config) -> int:
    return (producers(cfg) + RESTART_RINGS) * ring_bytes(cfg.ring_slots, cfg.shm_slot_bytes)


def needed_mib(cfg: Config) -> int:
    """``needed_bytes`` rounded up to whole MiB: the unit of ``--shm-size=Nm`` and ``sizeLimit: NMi``."""
    return -(-needed_bytes(cfg) // MIB)


def free_bytes(path: str = shm.SHM_DIR) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def describe(cfg: Config) -> str:
    """The line ``aieng config`` prints."""
    return (f"shared memory needed: {needed_mib(cfg)} MiB ({producers(cfg)} rings + {RESTART_RINGS} for a "
            f"restart, {cfg.ring_slots} slots x {cfg.shm_slot_bytes} bytes each)")


def check(cfg: Config, path: str = shm.SHM_DIR) -> None:
    """Raise ``ShmTooSmall`` when ``path`` has less free space than ``needed_bytes(cfg)``."""
    need, free = needed_bytes(cfg), free_bytes(path)
    if free >= need:
        return
    n = needed_mib(cfg)
    sizes = (f"{producers(cfg)} rings + {RESTART_RINGS} for a restart, "
             f"{cfg.ring_slots} slots x {cfg.shm_slot_bytes} bytes")
    raise ShmTooSmall(
        f"{path} has {free // MIB} MiB free but the shared-memory rings need {n} MiB ({sizes}): give it more "
        f"(docker/podman run --shm-size={n}m; Kubernetes: an emptyDir with medium: Memory and "
        f"sizeLimit: {n}Mi mounted on /dev/shm) or lower AIENG_SHM_SLOTS, AIENG_SHM_SLOT_BYTES or "
        "AIENG_MAX_INFLIGHT")
