"""Immutable values for the typed spec (``models/spec.py``, ``models/sections.py``) and its wire form.

``Opaque`` holds a value exactly as model.yaml wrote it, frozen (maps become ``FrozenMap``, lists
tuples), for what the server never reads by key: it is shown to clients whole (``thaw``) or handed whole
to the parser that owns it.  ``thaw(freeze(v)) == v`` for anything YAML or msgpack produce.

``plain`` turns a tree of frozen dataclasses into msgpack-safe maps and lists (``ModelSpec.to_dict``);
``build(cls, data)`` rebuilds it from the field types (once per spec received: at a worker's start, a
``LoadVersion``), calling ``cls.from_wire`` where a class picks its own subclass.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any


class FrozenMap(tuple):
    """A map frozen as its ``(key, value)`` pairs, in order; no lookup by key (``thaw`` gives a dict)."""

    __slots__ = ()


INTERN_MAX = 64  # a name, a dtype, a key, a hash: the same few strings in every spec of a process


def freeze(value: Any) -> Any:
    if type(value) is str:
        # one object per distinct short string in the process, not one per spec that holds it (a spec
        # rebuilt from msgpack has its own copy of every "name", "x", "float32": ~1 KiB a model)
        return sys.intern(value) if len(value) <= INTERN_MAX else value
    if isinstance(value, dict):
        return FrozenMap((freeze(k), freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    if isinstance(value, FrozenMap):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Opaque:
    """A value as written, frozen; the server shows it or hands it whole to its parser, never reads a key."""
    value: Any = None

    @classmethod
    def of(cls, raw: Any) -> "Opaque":
        return cls(freeze(raw))

    def thaw(self) -> Any:
        return thaw(self.value)


NO_VALUE = Opaque(FrozenMap())  # an empty map, as written


def plain(obj: Any) -> Any:
    """A frozen dataclass tree as msgpack-safe maps and lists."""
    if isinstance(obj, Opaque):
        return obj.thaw()
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [plain(v) for v in obj]
    return obj


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build(hint: Any, data: Any) -> Any:
    """``data`` (from ``plain``, through msgpack) back as the type ``hint`` names."""
    if data is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return build(inner[0], data) if len(inner) == 1 else data
    if origin is tuple:
        if not isinstance(data, (list, tuple)):  # a value as written that is not a list: kept, frozen
            return freeze(data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(build(args[0], v) for v in data)
        return tuple(build(a, v) for a, v in zip(args, data)) if args else freeze(data)
    if hint is Opaque:
        return Opaque.of(data)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(data, dict):
        return hint.from_wire(data) if "from_wire" in vars(hint) else build_fields(hint, data)
    return freeze(data)  # a scalar, or a value as written (frozen as the scan froze it)


def build_fields(cls: type, data: dict) -> Any:
    """``cls`` from its fields' wire values (a field the map lacks keeps its default)."""
    hints = _hints(cls)
    return cls(**{f.name: build(hints[f.name], data[f.name])
                  for f in dataclasses.fields(cls) if f.name in data})
