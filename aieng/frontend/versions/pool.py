"""Model pool: the pure bookkeeping behind lazy loading and LRU eviction under a memory budget.

No I/O, no clock, no event loop: the frontend (``poolctl``) feeds it events and asks it questions,
passing ``now`` (monotonic seconds) where time matters; every rule is unit-tested
(tests/unit/test_pool.py).  A model-wide ``pool:`` section is read by ``models/settings.py``
(``PoolSetting``: only a lazy, unpinned model is evictable).  ``Pool`` tracks the resident versions
(``loaded``/``unloaded``; a loading one ``reserve``s its estimate, never evicted), their footprints
(the last measured reading, 0 meaning "not measured"; ``need`` is what a load will take, the caller's
estimate when there is none or when a reading above the whole budget is ``remeasure_s`` old), recency
(``touch``; a load counts as a use) and requests in flight (``begin``/``end``, ``set_inflight``).
``plan`` names the versions to evict, LRU first, so a load fits: never pinned, busy, warm (used within
``warm_s``) or the loading one; ``[]`` when it fits (or no budget), ``None`` when it cannot (``refusal``
says why).
``ColdStarts`` holds the requests waiting for a load, bounded per version, released by ``ready``/``failed``,
or handed back by ``expired``; at the bound, ``make_place`` gives a newcomer the place of the newest waiter
of the owner (a principal, a CURVE key, a connection) holding the most, when that one holds more than the
newcomer would, so one owner cannot keep every other out of a cold load.  The rules and why:
docs/rollout.md, section 10.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Hashable, TypeVar

Key = tuple[str, str]  # (model, version)
T = TypeVar("T")


def cold_start_message(model: str) -> str:
    return f"model {model} is loading (cold start), not ready within the deadline"


def refusal(model: str, version: str, need: int, budget: int, used: int, warm_s: float,
            retry_in: float | None = None) -> str:
    """Why a load of ``need`` bytes cannot fit: more than the whole budget (``retry_in``: seconds until a
    measurement that said so is tried again), or ``used`` bytes held by versions it may not evict."""
    if need > budget:
        why = (f"model {model} version {version} needs {need} bytes, more than the whole memory budget of "
               f"{budget} bytes (AIENG_MODEL_MEMORY_BUDGET)")
        if retry_in is not None:
            why += (f"; that was measured, and it is loaded and measured again {retry_in:.0f}s from now "
                    "(AIENG_POOL_REMEASURE_S)")
        return why
    return (f"model {model} version {version} needs {need} bytes; the memory budget is {budget} bytes, "
            f"{used} in use by pinned, busy or warm versions (a version that served a request in the last "
            f"{warm_s:g}s is not evicted: AIENG_POOL_WARM_S) (AIENG_MODEL_MEMORY_BUDGET)")


@dataclass
class _Entry:
    footprint: int
    evictable: bool
    inflight: int = 0
    used_at: float = float("-inf")  # ``now`` of its last request routed to it, or of its load


class Pool:
    def __init__(self, budget: int, warm_s: float = 0.0, remeasure_s: float = 0.0):
        if budget < 0:
            raise ValueError("the memory budget must be >= 0 (0: no budget)")
        self.budget, self.warm_s, self.remeasure_s = budget, warm_s, remeasure_s
        self._resident: OrderedDict[Key, _Entry] = OrderedDict()  # least recently used first
        # key -> (bytes, ``now`` of the reading): survives an unload, the estimate for the next load
        self._measured: dict[Key, tuple[int, float]] = {}

    def loaded(self, key: Key, footprint: int, evictable: bool, now: float, default: int = 0) -> None:
        """A version is resident everywhere; ``footprint`` is its measured size in bytes (0: not measured:
        its last measurement stands, else ``default``).  ``now`` -inf: not a use (resident at start)."""
        if footprint > 0:
            self._measured[key] = (footprint, now)
        size = self._measured[key][0] if key in self._measured else default
        self._resident[key] = _Entry(size, evictable, used_at=now)
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
        """``key``'s last measured footprint, else ``default`` (what ``models`` shows)."""
        return self._measured[key][0] if key in self._measured else default

    def footprint(self, key: Key) -> int:
        """The bytes ``key`` counts for: as resident (measured, else estimated), else its last measurement."""
        entry = self._resident.get(key)
        return entry.footprint if entry is not None else self.estimate(key, 0)

    def is_measured(self, key: Key) -> bool:
        return key in self._measured

    def measured(self, key: Key) -> int:
        """``key``'s last measured footprint when it is within the budget, else 0 (for sibling estimates)."""
        size = self.estimate(key, 0)
        return size if not self.budget or size <= self.budget else 0

    def need(self, key: Key, default: int, now: float) -> int:
        """What a load of ``key`` will take: its last measured footprint, else ``default``; a measurement
        above the whole budget counts only for ``remeasure_s`` after it was taken."""
        if key not in self._measured:
            return default
        size, at = self._measured[key]
        if self.budget and size > self.budget and now - at >= self.remeasure_s:
            return default
        return size

    def retry_in(self, key: Key, now: float) -> float | None:
        """Seconds until a measurement of ``key`` above the whole budget stops counting (None: none)."""
        size, at = self._measured.get(key, (0, 0.0))
        if not self.budget or size <= self.budget:
            return None
        return max(0.0, at + self.remeasure_s - now)

    def touch(self, key: Key, now: float) -> None:
        entry = self._resident.get(key)
        if entry is not None:
            entry.used_at = now
            self._resident.move_to_end(key)

    def warm(self, key: Key, now: float) -> bool:
        entry = self._resident.get(key)
        return entry is not None and now - entry.used_at < self.warm_s

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

    def _may_evict(self, entry: _Entry, now: float) -> bool:
        return entry.evictable and entry.inflight == 0 and now - entry.used_at >= self.warm_s

    def plan(self, key: Key, need: int, now: float) -> list[Key] | None:
        """Versions to evict (LRU first) so a load of ``need`` bytes fits; None if it cannot fit."""
        if self.budget == 0:
            return []
        used = sum(e.footprint for k, e in self._resident.items() if k != key)
        victims: list[Key] = []
        for k, entry in self._resident.items():
            if used + need <= self.budget:
                break
            if k == key or not self._may_evict(entry, now):
                continue
            victims.append(k)
            used -= entry.footprint
        return victims if used + need <= self.budget else None

    def stuck(self, key: Key, now: float) -> int:
        """Bytes that ``plan`` may not free for ``key``: pinned, busy, warm (for ``refusal``)."""
        return sum(e.footprint for k, e in self._resident.items() if k != key and not self._may_evict(e, now))


class ColdStarts(Generic[T]):
    """Requests waiting for a version that is loading; ``T`` is the caller's request object."""

    def __init__(self, max_waiting: int):
        if max_waiting < 1:
            raise ValueError("max_waiting must be >= 1")
        self.max_waiting = max_waiting
        self._waiting: dict[Hashable, list[tuple[float, T, Hashable]]] = {}  # (deadline, request, owner)

    def loading(self, key: Hashable) -> bool:
        return key in self._waiting

    def start(self, key: Hashable) -> bool:
        """Mark ``key`` loading; False when a load is already under way (do not start another)."""
        if key in self._waiting:
            return False
        self._waiting[key] = []
        return True

    def add(self, key: Hashable, deadline: float, request: T, owner: Hashable = None) -> bool:
        queue = self._waiting.setdefault(key, [])
        if len(queue) >= self.max_waiting:
            return False
        queue.append((deadline, request, owner))
        return True

    def make_place(self, key: Hashable, owner: Hashable) -> T | None:
        """At the bound: take out and return the newest waiter of the owner holding the most (the caller
        refuses it), when it holds at least two more than ``owner``; None when no place is made."""
        queue = self._waiting.get(key, [])
        held: dict[Hashable, int] = {}
        for _, _, o in queue:  # only when full: at most max_waiting entries
            held[o] = held.get(o, 0) + 1
        if not held:
            return None
        top = max(held, key=held.__getitem__)
        if held[top] < held.get(owner, 0) + 2:
            return None
        at = max(i for i, (_, _, o) in enumerate(queue) if o == top)
        return queue.pop(at)[1]

    def ready(self, key: Hashable) -> list[T]:
        """The load finished: every waiter, in arrival order, to dispatch now."""
        return [req for _, req, _ in self._waiting.pop(key, [])]

    failed = ready  # a failed load releases its waiters the same way; the caller answers them

    def expired(self, now: float) -> list[tuple[Hashable, T]]:
        """Remove and return the waiters whose deadline has passed (answer UNAVAILABLE)."""
        out: list[tuple[Hashable, T]] = []
        for key, queue in self._waiting.items():
            keep = [w for w in queue if w[0] > now]
            out.extend((key, r) for d, r, _ in queue if d <= now)
            queue[:] = keep
        return out

    def waiting(self, key: Hashable) -> int:
        return len(self._waiting.get(key, ()))
