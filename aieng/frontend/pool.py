"""Model pool: the pure bookkeeping behind lazy loading and LRU eviction under a memory budget.

No I/O, no clock, no event loop: the frontend (hot swap, admission) feeds it events and asks it
questions, so every rule here is unit-tested without a server (tests/unit/test_pool.py).

Contract:
- ``parse_setting`` reads a model-wide ``pool:`` section (``{lazy: bool, pinned: bool}``, both
  default false) and refuses anything else with a ``ValueError`` naming ``where``.  A model that is
  not lazy is pinned whatever it says: only lazy, unpinned models are *evictable*, because an
  evicted version must be able to come back by itself on its next request (the lazy load path).
- ``Pool`` tracks the resident versions (``loaded``/``unloaded``), their footprint in bytes (the
  largest measured for that version: a reload after an eviction reuses memory the allocator kept
  and measures less than the version holds; an estimate until one is measured), their recency
  (``touch`` on every request routed to them) and their requests in flight (``begin``/``end``, or
  ``set_inflight`` from the request table).  ``reserve`` holds a loading version's estimate: it
  counts against the budget and is never evicted until ``loaded``/``unloaded`` replaces it.
- ``Pool.plan(key, need)`` answers which versions to evict, least recently used first, so that a
  load of ``need`` bytes fits the budget: never a pinned version, never one with a request in
  flight, never ``key`` itself.  ``[]`` when it fits already (or the budget is 0: no budget);
  ``None`` when it cannot fit even after every eligible eviction (the caller refuses the load and
  says why with ``refusal``).
- ``ColdStarts`` holds the requests that arrive for a version while it loads: bounded per version
  (``add`` returns False when full: the caller answers OVERLOADED), released all at once by
  ``ready``/``failed``, and ``expired(now)`` hands back the ones whose deadline passed, which the
  caller answers UNAVAILABLE with ``cold_start_message``.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, Hashable, TypeVar

Key = tuple[str, str]  # (model, version)
T = TypeVar("T")


@dataclass(frozen=True)
class PoolSetting:
    lazy: bool = False
    pinned: bool = False

    @property
    def evictable(self) -> bool:
        return self.lazy and not self.pinned


def parse_setting(raw: Any, where: str) -> PoolSetting:
    """The model-wide ``pool`` section; ``None`` (absent) is the default: eager and pinned."""
    if raw is None:
        return PoolSetting()
    if not isinstance(raw, dict) or set(raw) - {"lazy", "pinned"}:
        raise ValueError(f"{where}: pool takes only lazy and pinned")
    for name, value in raw.items():
        if not isinstance(value, bool):
            raise ValueError(f"{where}: pool.{name} must be true or false")
    return PoolSetting(lazy=raw.get("lazy", False), pinned=raw.get("pinned", False))


def cold_start_message(model: str) -> str:
    return f"model {model} is loading (cold start), not ready within the deadline"


def refusal(model: str, version: str, need: int, budget: int, used: int) -> str:
    return (f"model {model} version {version} needs {need} bytes; the memory budget is {budget} bytes, "
            f"{used} in use by pinned or busy versions (AIENG_MODEL_MEMORY_BUDGET)")


@dataclass
class _Entry:
    footprint: int
    evictable: bool
    inflight: int = 0


class Pool:
    def __init__(self, budget: int):
        if budget < 0:
            raise ValueError("the memory budget must be >= 0 (0: no budget)")
        self.budget = budget
        self._resident: OrderedDict[Key, _Entry] = OrderedDict()  # least recently used first
        self._measured: dict[Key, int] = {}  # survives an unload: the estimate for the next load

    def loaded(self, key: Key, footprint: int, evictable: bool) -> None:
        """A version is resident everywhere; ``footprint`` is its measured size in bytes (0: none)."""
        size = self._measured[key] = max(self._measured.get(key, 0), footprint)
        self._resident[key] = _Entry(size, evictable)
        self._resident.move_to_end(key)  # a fresh load counts as a use: it was loaded for a request

    def reserve(self, key: Key, need: int) -> None:
        """A load of ``key`` is under way: ``need`` bytes are taken, and it is not evictable."""
        self._resident[key] = _Entry(max(0, need), False)
        self._resident.move_to_end(key)

    def unloaded(self, key: Key) -> None:
        self._resident.pop(key, None)

    def resident(self, key: Key) -> bool:
        return key in self._resident

    def estimate(self, key: Key, default: int) -> int:
        """What a load of ``key`` will take: its last measured footprint, else ``default``."""
        return self._measured.get(key, default)

    def touch(self, key: Key) -> None:
        if key in self._resident:
            self._resident.move_to_end(key)

    def begin(self, key: Key) -> None:
        if key in self._resident:
            self._resident[key].inflight += 1

    def end(self, key: Key) -> None:
        entry = self._resident.get(key)
        if entry is not None and entry.inflight > 0:
            entry.inflight -= 1

    def set_inflight(self, counts: dict[Key, int]) -> None:
        """Requests in flight per version, from the caller's request table (absent: none)."""
        for key, entry in self._resident.items():
            entry.inflight = max(0, counts.get(key, 0))

    def used(self) -> int:
        return sum(e.footprint for e in self._resident.values())

    def order(self) -> list[Key]:
        """Resident versions, least recently used first (for ``models`` and tests)."""
        return list(self._resident)

    def plan(self, key: Key, need: int) -> list[Key] | None:
        """Versions to evict (LRU first) so a load of ``need`` bytes fits; None if it cannot fit."""
        if self.budget == 0:
            return []
        used = sum(e.footprint for k, e in self._resident.items() if k != key)
        victims: list[Key] = []
        for k, entry in self._resident.items():
            if used + need <= self.budget:
                break
            if k == key or not entry.evictable or entry.inflight > 0:
                continue
            victims.append(k)
            used -= entry.footprint
        return victims if used + need <= self.budget else None

    def stuck(self, key: Key) -> int:
        """Bytes that ``plan`` may not free for ``key``: pinned, busy (for ``refusal``)."""
        return sum(e.footprint for k, e in self._resident.items()
                   if k != key and (not e.evictable or e.inflight > 0))


class ColdStarts(Generic[T]):
    """Requests waiting for a version that is loading; ``T`` is the caller's request object."""

    def __init__(self, max_waiting: int):
        if max_waiting < 1:
            raise ValueError("max_waiting must be >= 1")
        self.max_waiting = max_waiting
        self._waiting: dict[Hashable, list[tuple[float, T]]] = {}

    def loading(self, key: Hashable) -> bool:
        return key in self._waiting

    def start(self, key: Hashable) -> bool:
        """Mark ``key`` loading; False when a load is already under way (do not start another)."""
        if key in self._waiting:
            return False
        self._waiting[key] = []
        return True

    def add(self, key: Hashable, deadline: float, request: T) -> bool:
        queue = self._waiting.setdefault(key, [])
        if len(queue) >= self.max_waiting:
            return False
        queue.append((deadline, request))
        return True

    def ready(self, key: Hashable) -> list[T]:
        """The load finished: every waiter, in arrival order, to dispatch now."""
        return [req for _, req in self._waiting.pop(key, [])]

    failed = ready  # a failed load releases its waiters the same way; the caller answers them

    def expired(self, now: float) -> list[tuple[Hashable, T]]:
        """Remove and return the waiters whose deadline has passed (answer UNAVAILABLE)."""
        out: list[tuple[Hashable, T]] = []
        for key, queue in self._waiting.items():
            keep = [(d, r) for d, r in queue if d > now]
            out.extend((key, r) for d, r in queue if d <= now)
            queue[:] = keep
        return out

    def waiting(self, key: Hashable) -> int:
        return len(self._waiting.get(key, ()))
