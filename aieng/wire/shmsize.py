"""How much ``/dev/shm`` the configured rings need, and the start-time check against it.

Contract:
  * ``needed_bytes(cfg)`` is the shared memory one instance may hold at once: one ring per producer
    (each preprocess worker and the executor; the frontend and postprocess workers only attach), each
    ``header_bytes(ring_slots) + ring_slots * shm_slot_bytes`` (slot size page-rounded exactly as
    ``shm.Ring.create`` does), plus ``RESTART_RINGS`` more: a restarted producer creates its new ring
    while consumers (the executor's and postprocess workers' ring caches) may still map the dead one's
    unlinked segment, whose pages tmpfs frees only at the last unmap.
  * A ring's bytes are ``ring_slots * shm_slot_bytes`` whatever its models: a model whose largest request
    or output is bigger than ``AIENG_SHM_SLOT_BYTES`` grows its producer's slots and the ring gets fewer of
    them (``ring_shape``, at least ``MIN_SLOTS``: a producer waits for a free slot, backpressure). Only
    slots above ``ring_slots * shm_slot_bytes / MIN_SLOTS`` (64 MiB at the defaults) exceed the figure.
  * A producer that also has small requests (some model's largest fits ``AIENG_SHM_SLOT_BYTES``: OCR
    crops beside textdet's pages in a preprocess worker) gets two size classes in those same bytes
    (``shm.Ring``): about half for the big slots (at least ``MIN_SLOTS``), the rest as slots of
    ``AIENG_SHM_SLOT_BYTES`` (at least ``MIN_SLOTS``), so pages never starve crops of slots.  The slot
    count stays <= ``ring_slots``, so the header too stays within the figure; with both minimums the
    figure holds for big slots up to ``ring_slots * shm_slot_bytes / MIN_SLOTS - shm_slot_bytes``.
  * tmpfs allocates only touched pages, so the real use is far smaller, but a write into a page that no
    longer fits raises SIGBUS in the writer: the space must be there before the first request.
  * ``check(cfg, path)`` compares with the free space ``os.statvfs(path)`` reports (``path`` defaults to
    ``shm.SHM_DIR``; tests pass another directory) and raises ``ShmTooSmall`` with a one-line message
    naming the size and how to grant it (``--shm-size``, Kubernetes ``emptyDir.sizeLimit``).
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
