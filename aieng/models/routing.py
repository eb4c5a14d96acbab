"""The ``routing`` section of a model's model.yaml, parsed: weights, rules and groups, shadow, auto-rollback.

Pure schema, no state: what the scan checks at load time (``settings.check_routing``) and what the
frontend's routing (``frontend/rollout/routing.py``: buckets, ``RoutingState``, ``build``), shadow
traffic (``frontend/rollout/shadow.py``) and auto-rollback (``frontend/rollout/canary.py``) build on.
``check_weights`` reads ``{version: percent}`` (known versions, summing to 100, in steps of one bucket:
0.01 percent of ``BUCKETS``); ``parse_rules`` the ordered ``rules`` (a group rule: the key is in a named
set; a feature rule: a predicate on ``params.<name>`` or an input's ``length``/``bytes``/``value``) and
their ``groups``; ``check_allow_pinned`` the ``allow_pinned`` flag; ``parse_shadow`` the ``shadow`` map
(``ShadowConfig``); ``AutoRollback.parse`` the ``auto_rollback`` map.  Each raises ``RoutingError`` (a
``ValueError``; ``AutoRollback.parse`` a plain ``ValueError``) naming the field, and nothing is changed.
Rules, limits and examples: docs/rollout.md, sections 2, 3, 5 and 8.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Iterable

BUCKETS = 10_000  # a key hashes to one of these; a weight owns round(w * 100) of them
OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
       ">=": operator.ge, "in": lambda a, b: a in b, "not_in": lambda a, b: a not in b}
PROPERTIES = ("length", "bytes", "value")
MAX_RULES = 64
MAX_GROUP = 100_000  # keys in one group
# Characters of routing keys (a key's length + 1 each) in the groups of one routing, all together: what the
# state file holds for it (the frontend keeps a model's history within twice this: frontend/rollout/model.py).
# 100,000 keys of up to 40 characters fit; a routing over it is refused, never truncated.
MAX_GROUP_CHARS = 4 * 1024 * 1024
DEFAULT_MAX_LOAD = 0.5  # a shadow's share of max_inflight above which copies are shed


class RoutingError(ValueError):
    """A routing config or admin change that cannot be applied; nothing was changed."""


def version_order(v: str):
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
        have = sorted(versions, key=version_order)
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


# -- weights, allow_pinned, shadow, auto_rollback ----------------------------------------
def check_weights(raw: Any, versions: set[str]) -> dict[str, float]:
    """Validate a ``{version: percent}`` map: known versions, numbers >= 0, summing to 100."""
    if not isinstance(raw, dict) or not raw:
        raise RoutingError("weights must be a non-empty map of version -> percent")
    out: dict[str, float] = {}
    for v, w in raw.items():
        v = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
        if v not in versions:
            raise RoutingError(f"unknown version {v!r} (have {sorted(versions, key=version_order)})")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 100:
            raise RoutingError(f"weight of version {v!r} must be a number in 0..100, got {w!r}")
        out[v] = float(w)
    total = sum(out.values())
    if abs(total - 100.0) > 1e-6:
        raise RoutingError(f"weights must sum to 100, they sum to {total:g}")
    if any(round(w * BUCKETS / 100) != w * BUCKETS / 100 for w in out.values()):
        raise RoutingError("weights have a granularity of 0.01 percent (one bucket)")
    return out


def check_allow_pinned(raw: Any) -> bool:
    """``allow_pinned`` (absent: true)."""
    if raw is None:
        return True
    if not isinstance(raw, bool):
        raise RoutingError("allow_pinned must be true or false")
    return raw


@dataclass(frozen=True)
class ShadowConfig:
    version: str
    percent: float
    max_load: float = DEFAULT_MAX_LOAD
    timeout_ms: int = 0  # 0: the candidate's own timeout

    def public(self) -> dict:
        return {"version": self.version, "percent": self.percent, "max_load": self.max_load,
                "timeout_ms": self.timeout_ms}


def _number(raw: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not lo <= raw <= hi:
        raise RoutingError(f"shadow {name} must be a number in {lo:g}..{hi:g}, got {raw!r}")
    return float(raw)


def parse_shadow(raw: Any, versions: set[str]) -> ShadowConfig | None:
    """The ``shadow`` map (None: no shadow); ``RoutingError`` naming the field when malformed."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"version", "percent", "max_load", "timeout_ms"}:
        raise RoutingError("shadow takes version, percent, max_load, timeout_ms")
    version = raw.get("version")
    version = str(version) if isinstance(version, int) and not isinstance(version, bool) else version
    if version not in versions:
        raise RoutingError(f"shadow version {version!r} is not served (have {sorted(versions)})")
    percent = _number(raw.get("percent"), "percent", 0, 100)
    max_load = _number(raw.get("max_load", DEFAULT_MAX_LOAD), "max_load", 0, 1)
    timeout = raw.get("timeout_ms", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise RoutingError(f"shadow timeout_ms must be an int >= 0, got {timeout!r}")
    return ShadowConfig(version, percent, max_load, timeout)


@dataclass(frozen=True)
class AutoRollback:
    max_error_rate_delta: float = 0.05
    max_p99_ratio: float = 2.0
    window_s: float = 60.0
    min_requests: int = 20

    @classmethod
    def parse(cls, raw: object) -> "AutoRollback | None":
        """From model.yaml's ``routing.auto_rollback`` (None: off); ValueError if malformed."""
        if raw is None or raw is False:
            return None
        if not isinstance(raw, dict) or set(raw) - set(cls.__dataclass_fields__):
            raise ValueError(f"auto_rollback takes {sorted(cls.__dataclass_fields__)}")
        out = cls(**{k: v for k, v in raw.items()})
        for name in cls.__dataclass_fields__:
            v = getattr(out, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"auto_rollback.{name} must be a non-negative number")
        if out.window_s <= 0 or out.min_requests < 1 or out.max_p99_ratio < 1:
            raise ValueError("auto_rollback needs window_s > 0, min_requests >= 1 and max_p99_ratio >= 1")
        return out

    def public(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
