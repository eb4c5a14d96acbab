"""Which version of a model serves a request, and why: sticky weights and ordered rules.

Pure logic (no sockets, no clock of its own), held by the frontend.  A request's ``routing_key``
(else its id or trace) hashes (blake2b: the same in every process and run) to one of ``BUCKETS``
= 10,000; each version *owns* sorted bucket ranges ``[start, end)``, ``round(w * 100)`` buckets
for a weight of ``w`` percent.  A weight change moves the fewest buckets (``reallocate``): a
version that shrinks gives up its highest buckets and only versions that grow take them, lowest
first; so the ownership, not just the weights, is what is saved.  ``RoutingState.decide``, the
first that applies: 1. ``rules`` in order (a group rule: the key is in a named set; a feature rule:
a predicate on ``params.<name>`` or an input's ``length``/``bytes``/``value``) -> ``rule:<name>``;
2. a ``version`` the caller already resolved and checked (``allow_pinned``) -> ``pinned``;
3. the weights -> ``weight``.  ``RoutingState`` is immutable: a change builds a new one (``build``)
and the frontend swaps its pointer, so a rollback is a pointer flip.  Its shadow setting never
changes a decision (``mirror`` reads it).  The section it is built from (weights, rules, groups,
``allow_pinned``, shadow) is parsed by ``models/routing.py``.  Rules, limits and examples:
docs/rollout.md, sections 2 and 3.
"""
from __future__ import annotations

import array
import hashlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from aieng.models.routing import (
    BUCKETS,
    Group,
    RoutingError,
    Rule,
    check_allow_pinned,
    check_weights,
    listed,
    parse_rules,
    version_order,
)

MAX_KEY_CHARS = 256  # a routing_key longer than this is INVALID_REQUEST (protocol.py checks it)
_SERIALS = itertools.count(1)


def bucket_of(key: str) -> int:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


# -- bucket ownership ---------------------------------------------------------------
Ranges = dict[str, list[list[int]]]  # version -> sorted [start, end) ranges


def to_ranges(owner: list[str | None]) -> Ranges:
    out: Ranges = {}
    start = 0
    for i in range(1, BUCKETS + 1):
        if i == BUCKETS or owner[i] != owner[start]:
            if owner[start] is not None:
                out.setdefault(owner[start], []).append([start, i])
            start = i
    return out


def from_ranges(ranges: Ranges) -> list[str | None]:
    owner: list[str | None] = [None] * BUCKETS
    for version, spans in ranges.items():
        for start, end in spans:
            if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= BUCKETS):
                raise RoutingError(f"bad bucket range {[start, end]} for version {version!r}")
            for i in range(start, end):
                if owner[i] is not None:
                    raise RoutingError(f"bucket {i} is owned twice")
                owner[i] = version
    if any(o is None for o in owner):
        raise RoutingError("bucket ranges do not cover every bucket")
    return owner


def targets(weights: dict[str, float]) -> dict[str, int]:
    """Buckets per version: ``round(w * 100)``, the rounding error given to the largest weight."""
    want = {v: int(round(w * BUCKETS / 100)) for v, w in weights.items()}
    if want:
        top = max(sorted(want), key=lambda v: weights[v])
        want[top] += BUCKETS - sum(want.values())
    return want


def reallocate(owner: list[str | None] | None, weights: dict[str, float]) -> list[str | None]:
    """New ownership for ``weights``, moving as few buckets as possible from ``owner``."""
    want = targets(weights)
    new: list[str | None] = list(owner) if owner is not None else [None] * BUCKETS
    have: dict[str, int] = {}
    for i, v in enumerate(new):
        if v is not None and want.get(v, 0) > have.get(v, 0):
            have[v] = have.get(v, 0) + 1
        else:
            new[i] = None  # over its target (its highest buckets go first), or a version now gone
    free = (i for i in range(BUCKETS) if new[i] is None)
    for v in sorted(want, key=version_order):
        for _ in range(want[v] - have.get(v, 0)):
            new[next(free)] = v
    return new


class Ownership(Sequence):
    """The version owning each of the ``BUCKETS`` buckets, kept compact: the distinct versions in order of
    first appearance, and one byte per bucket indexing them, or no bytes at all while one version owns
    every bucket (a model's usual state).  A tuple of 10,000 references was 78 KiB per model in the
    frontend; this is about 100 bytes for one version, 10 KB for several.  Equal ownerships compare and
    hash equal (the first-appearance order makes their parts equal)."""

    __slots__ = ("versions", "index")

    def __init__(self, owner: Iterable[str | None]):
        owner = list(owner)
        if len(owner) != BUCKETS:
            raise ValueError(f"an ownership has {BUCKETS} buckets, not {len(owner)}")
        where: dict[str | None, int] = {}
        for v in owner:
            where.setdefault(v, len(where))
        self.versions: tuple[str | None, ...] = tuple(where)
        if len(where) == 1:
            self.index: bytes | array.array | None = None
        else:
            idx = map(where.__getitem__, owner)
            self.index = bytes(idx) if len(where) <= 256 else array.array("H", idx)

    def __len__(self) -> int:
        return BUCKETS

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        if self.index is None:
            if not -BUCKETS <= i < BUCKETS:
                raise IndexError(i)
            return self.versions[0]
        return self.versions[self.index[i]]

    def __iter__(self) -> Iterator[str | None]:
        if self.index is None:
            return itertools.repeat(self.versions[0], BUCKETS)
        return map(self.versions.__getitem__, self.index)

    def __eq__(self, other) -> bool:
        if isinstance(other, Ownership):
            return self.versions == other.versions and self.index == other.index
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.versions, self.index if self.index is None else bytes(self.index)))

    def __repr__(self) -> str:
        return f"Ownership({to_ranges(list(self))})"


# -- the state of one model ------------------------------------------------------------------
@dataclass(frozen=True)
class RoutingState:
    weights: dict[str, float]
    owner: Ownership  # version per bucket
    ranges: dict  # the same as ranges (computed once: what is shown and saved)
    rules: tuple[Rule, ...] = ()
    groups: dict[str, Group] = field(default_factory=dict)
    allow_pinned: bool = True
    reason: str = ""  # what made this state (config, set_weights, rollback, auto-rollback, ...)
    shadow: Any = None  # models.routing.ShadowConfig: requests mirrored to a candidate (None: none)
    serial: int = field(default_factory=lambda: next(_SERIALS), compare=False)  # unique per state built

    def routes_as(self, other: "RoutingState") -> bool:
        """Does ``other`` route every request as this state does (its ``reason`` aside)?"""
        return replace(self, reason="") == replace(other, reason="")

    def public(self, group: Callable[[Group], Any] = listed) -> dict:
        """As shown and saved; ``group`` turns each group into what stands for it (its keys by default,
        a reference into the state file's table of groups when saved)."""
        return {"weights": dict(self.weights), "ranges": self.ranges,
                "rules": [r.public() for r in self.rules],
                "groups": {name: group(g) for name, g in self.groups.items()},
                "allow_pinned": self.allow_pinned, "reason": self.reason,
                "shadow": self.shadow.public() if self.shadow is not None else None}

    @property
    def stable(self) -> str:
        """The version with the largest weight (ties: the lowest version)."""
        return max(sorted(self.weights, key=version_order), key=lambda v: self.weights[v])

    def decide(self, key: str | None, fallback_key: str, pinned: str | None, params: dict,
               inputs: dict) -> tuple[str, str]:
        """(version, route) for one request; ``pinned`` already checked against the model's versions."""
        for rule in self.rules:
            if rule.matches(key, params, inputs, self.groups):
                return rule.version, "rule:" + rule.name
        if pinned is not None:
            return pinned, "pinned"
        owner = self.owner
        if owner.index is None:  # one version owns every bucket: no hash needed
            return owner.versions[0], "weight"
        return owner.versions[owner.index[bucket_of(key if key is not None else fallback_key)]], "weight"


KEEP = object()  # build(shadow=KEEP): the previous state's shadow setting stands


def build(prev: RoutingState | None, versions: set[str], weights: Any = None, rules: Any = None,
          allow_pinned: Any = None, reason: str = "", shadow: Any = KEEP) -> RoutingState:
    """A new state from ``prev`` with whatever is given changed; ``RoutingError`` changes nothing.
    ``shadow`` is an already parsed ``models.routing.ShadowConfig`` or None (off)."""
    if weights is None and prev is None:
        raise RoutingError("weights are needed for a new routing")
    w = check_weights(weights, versions) if weights is not None else prev.weights
    if rules is not None:
        rs, groups = parse_rules(rules, versions, prev.groups if prev else None)
    else:
        rs, groups = (prev.rules, prev.groups) if prev else ((), {})
    pinned = prev.allow_pinned if allow_pinned is None and prev else check_allow_pinned(allow_pinned)
    if prev is not None and weights is None:
        owner, ranges = prev.owner, prev.ranges
    else:
        owner = Ownership(reallocate(list(prev.owner) if prev else None, w))
        ranges = to_ranges(list(owner))
    if shadow is KEEP:
        shadow = prev.shadow if prev is not None else None
    if shadow is not None and shadow.version not in versions:
        raise RoutingError(f"shadow version {shadow.version!r} is not served")
    return RoutingState(w, owner, ranges, rs, groups, pinned, reason, shadow)
