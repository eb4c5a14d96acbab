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
changes a decision (``mirror`` reads it).  Rules, limits and examples: docs/rollout.md, sections
2 and 3.
"""
from __future__ import annotations

import hashlib
import itertools
import operator
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

BUCKETS = 10_000
OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
       ">=": operator.ge, "in": lambda a, b: a in b, "not_in": lambda a, b: a not in b}
PROPERTIES = ("length", "bytes", "value")
MAX_KEY_CHARS = 256  # a routing_key longer than this is INVALID_REQUEST (protocol.py checks it)
MAX_RULES = 64
MAX_GROUP = 100_000  # keys in one group
# Characters of routing keys (a key's length + 1 each) in the groups of one routing, all together: what the
# state file holds for it (rollout.py keeps history within twice this per model).  100,000 keys of up to 40
# characters fit; a routing over it is refused, never truncated.
MAX_GROUP_CHARS = 4 * 1024 * 1024
_SERIALS = itertools.count(1)


class RoutingError(ValueError):
    """A routing config or admin change that cannot be applied; nothing was changed."""


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
    for v in sorted(want, key=_version_order):
        for _ in range(want[v] - have.get(v, 0)):
            new[next(free)] = v
    return new


def _version_order(v: str):
    return (0, int(v), v) if v.isdigit() else (1, 0, v)


# -- rules ------------------------------------------------------------------------------
class Group(frozenset):
    """A group's routing keys: a set for membership, and the keys in the order given (``order``: what is
    shown and saved, so a group read back from the state file has the same order, hence the same content
    digest there).  ``chars`` is its size as ``MAX_GROUP_CHARS`` counts it.  Immutable, so every routing
    state built from another shares its groups, and the state file stores each once."""
    __slots__ = ("order", "chars")
    order: tuple[str, ...]
    chars: int

    def __new__(cls, keys: Iterable[str]) -> "Group":
        order = tuple(dict.fromkeys(keys))
        self = super().__new__(cls, order)
        self.order = order
        self.chars = sum(map(len, order)) + len(order)
        return self


def make_group(name: Any, keys: Any) -> Group:
    """A group from a config's ``[key, ...]`` (str or int keys); ``RoutingError`` if malformed."""
    if isinstance(keys, Group) and isinstance(name, str):
        return keys
    if (not isinstance(name, str) or not isinstance(keys, list) or len(keys) > MAX_GROUP
            or not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys)):
        raise RoutingError(f"group {name!r} must be a list of at most {MAX_GROUP} str/int routing keys")
    return Group(str(k) for k in keys)


def listed(group: Group) -> list[str]:
    return list(group.order)


@dataclass(frozen=True)
class Rule:
    name: str
    version: str
    group: str = ""  # group rule: routing_key in groups[group]
    param: str = ""  # feature rule on params[param] ...
    input: str = ""  # ... or on an input's property
    prop: str = "value"
    op: str = "=="
    value: Any = None

    def public(self) -> dict:
        if self.group:
            return {"name": self.name, "group": self.group, "version": self.version}
        where = {"param": self.param} if self.param else {"input": self.input, "property": self.prop}
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"name": self.name, "when": dict(where, op=self.op, value=value), "version": self.version}

    def matches(self, key: str | None, params: dict, inputs: dict, groups: dict[str, Group]) -> bool:
        if self.group:
            return key is not None and key in groups.get(self.group, ())
        if self.param:
            if self.param not in params:
                return False
            got = params[self.param]
        else:
            if self.input not in inputs:
                return False
            got = input_property(inputs[self.input], self.prop)
            if got is None:
                return False
        try:
            return bool(OPS[self.op](got, self.value))
        except TypeError:  # e.g. comparing a str with a number: the rule does not apply
            return False


def input_property(value: Any, prop: str) -> Any:
    if prop == "length":
        return len(value) if isinstance(value, str) else None
    if prop == "bytes":
        return len(value) if isinstance(value, (bytes, bytearray, memoryview)) else None
    if isinstance(value, bool):
        return None
    return value if isinstance(value, (int, float, str)) else None


def parse_rules(raw: Any, versions: set[str], prev: dict[str, Group] | None = None
                ) -> tuple[tuple[Rule, ...], dict[str, Group]]:
    """``{"groups": {name: [keys]}, "rules": [...]}`` -> rules and groups; ``RoutingError`` if malformed.
    A group equal to ``prev``'s of that name is ``prev``'s object (one copy in memory and in the file)."""
    if not isinstance(raw, dict):
        raise RoutingError("rules must be a map with 'rules' and optional 'groups'")
    groups_raw = raw.get("groups") or {}
    if not isinstance(groups_raw, dict):
        raise RoutingError("'groups' must map a group name to a list of routing keys")
    groups: dict[str, Group] = {}
    for name, keys in groups_raw.items():
        group = make_group(name, keys)
        old = (prev or {}).get(name)
        groups[name] = old if old is not None and old == group else group
    chars = sum(g.chars for g in groups.values())
    if chars > MAX_GROUP_CHARS:
        raise RoutingError(f"the groups hold {chars:,} characters of routing keys (each key's length + 1), "
                           f"over the limit of {MAX_GROUP_CHARS:,} for one routing")
    items = raw.get("rules") or []
    if not isinstance(items, list) or len(items) > MAX_RULES:
        raise RoutingError(f"'rules' must be a list of at most {MAX_RULES} rules")
    rules, seen = [], set()
    for i, item in enumerate(items):
        rules.append(_parse_rule(item, i, versions, groups))
        if rules[-1].name in seen:
            raise RoutingError(f"rule name {rules[-1].name!r} is used twice")
        seen.add(rules[-1].name)
    return tuple(rules), groups


def _parse_rule(item: Any, i: int, versions: set[str], groups: dict) -> Rule:
    where = f"rule {i}"
    if not isinstance(item, dict):
        raise RoutingError(f"{where} must be a map")
    name, version = item.get("name"), item.get("version")
    if not isinstance(name, str) or not name or len(name) > 64 or not name.isprintable():
        raise RoutingError(f"{where}: 'name' must be a non-empty printable str of <= 64 chars")
    where = f"rule {name!r}"
    version = str(version) if isinstance(version, int) and not isinstance(version, bool) else version
    if version not in versions:
        have = sorted(versions, key=_version_order)
        raise RoutingError(f"{where}: unknown version {version!r} (have {have})")
    unknown = set(item) - {"name", "version", "group", "when"}
    if unknown or ("group" in item) == ("when" in item):
        raise RoutingError(f"{where}: needs exactly one of 'group' or 'when' (and only name, version)")
    if "group" in item:
        if item["group"] not in groups:
            raise RoutingError(f"{where}: unknown group {item['group']!r}")
        return Rule(name, version, group=item["group"])
    when = item["when"]
    if not isinstance(when, dict) or set(when) - {"param", "input", "property", "op", "value"}:
        raise RoutingError(f"{where}: 'when' takes param or input (+ property), op, value")
    param, inp = when.get("param"), when.get("input")
    if (param is None) == (inp is None) or not isinstance(param or inp, str):
        raise RoutingError(f"{where}: 'when' needs exactly one of 'param' or 'input' (a name)")
    prop = when.get("property", "value")
    if inp is not None and prop not in PROPERTIES:
        raise RoutingError(f"{where}: property must be one of {PROPERTIES}")
    op, value = when.get("op"), when.get("value")
    if op not in OPS:
        raise RoutingError(f"{where}: op must be one of {sorted(OPS)}")
    if op in ("in", "not_in"):
        if not isinstance(value, list):
            raise RoutingError(f"{where}: op {op!r} needs a list value")
        value = tuple(value)
    elif op not in ("==", "!=") and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RoutingError(f"{where}: op {op!r} needs a number value")
    return Rule(name, version, param=param or "", input=inp or "", prop=prop, op=op, value=value)


# -- the state of one model ------------------------------------------------------------------
@dataclass(frozen=True)
class RoutingState:
    weights: dict[str, float]
    owner: tuple  # version per bucket
    ranges: dict  # the same as ranges (computed once: what is shown and saved)
    rules: tuple[Rule, ...] = ()
    groups: dict[str, Group] = field(default_factory=dict)
    allow_pinned: bool = True
    reason: str = ""  # what made this state (config, set_weights, rollback, auto-rollback, ...)
    shadow: Any = None  # shadow.ShadowConfig: requests mirrored to a candidate (None: none)
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
        return max(sorted(self.weights, key=_version_order), key=lambda v: self.weights[v])

    def decide(self, key: str | None, fallback_key: str, pinned: str | None, params: dict,
               inputs: dict) -> tuple[str, str]:
        """(version, route) for one request; ``pinned`` already checked against the model's versions."""
        for rule in self.rules:
            if rule.matches(key, params, inputs, self.groups):
                return rule.version, "rule:" + rule.name
        if pinned is not None:
            return pinned, "pinned"
        return self.owner[bucket_of(key if key is not None else fallback_key)], "weight"


def check_weights(raw: Any, versions: set[str]) -> dict[str, float]:
    """Validate a ``{version: percent}`` map: known versions, numbers >= 0, summing to 100."""
    if not isinstance(raw, dict) or not raw:
        raise RoutingError("weights must be a non-empty map of version -> percent")
    out: dict[str, float] = {}
    for v, w in raw.items():
        v = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
        if v not in versions:
            raise RoutingError(f"unknown version {v!r} (have {sorted(versions, key=_version_order)})")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 100:
            raise RoutingError(f"weight of version {v!r} must be a number in 0..100, got {w!r}")
        out[v] = float(w)
    total = sum(out.values())
    if abs(total - 100.0) > 1e-6:
        raise RoutingError(f"weights must sum to 100, they sum to {total:g}")
    if any(round(w * BUCKETS / 100) != w * BUCKETS / 100 for w in out.values()):
        raise RoutingError("weights have a granularity of 0.01 percent (one bucket)")
    return out


KEEP = object()  # build(shadow=KEEP): the previous state's shadow setting stands


def build(prev: RoutingState | None, versions: set[str], weights: Any = None, rules: Any = None,
          allow_pinned: Any = None, reason: str = "", shadow: Any = KEEP) -> RoutingState:
    """A new state from ``prev`` with whatever is given changed; ``RoutingError`` changes nothing.
    ``shadow`` is an already parsed ``shadow.ShadowConfig`` or None (off)."""
    if weights is None and prev is None:
        raise RoutingError("weights are needed for a new routing")
    w = check_weights(weights, versions) if weights is not None else prev.weights
    if rules is not None:
        rs, groups = parse_rules(rules, versions, prev.groups if prev else None)
    else:
        rs, groups = (prev.rules, prev.groups) if prev else ((), {})
    pinned = prev.allow_pinned if allow_pinned is None and prev else allow_pinned
    if pinned is None:
        pinned = True
    if not isinstance(pinned, bool):
        raise RoutingError("allow_pinned must be true or false")
    if prev is not None and weights is None:
        owner, ranges = prev.owner, prev.ranges
    else:
        owner = tuple(reallocate(list(prev.owner) if prev else None, w))
        ranges = to_ranges(list(owner))
    if shadow is KEEP:
        shadow = prev.shadow if prev is not None else None
    if shadow is not None and shadow.version not in versions:
        raise RoutingError(f"shadow version {shadow.version!r} is not served")
    return RoutingState(w, owner, ranges, rs, groups, pinned, reason, shadow)
