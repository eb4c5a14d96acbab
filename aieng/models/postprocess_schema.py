"""The postprocess op contract and its registry; no numpy-heavy imports, so models/repo.py validates with it.

An op is a small class registered under a name.  It declares its parameters (``PARAMS``: name, kind,
default, limits); a step's parameters are checked against them when a model's spec is loaded, so an
unknown op, an unknown key or a bad value fails the model's load with a message naming the step.

Ops read and write a *state*: a map of named values that starts as the model's outputs (read-only
shared-memory views) and that each step adds to.  An instance lists the names it reads (``inputs``)
and writes (``outputs``), so the chain knows what a skipped step leaves missing.  ``__call__(state,
params, degraded)`` returns ``{name: value}`` (only names among ``outputs``); ``params`` are the
client's request params and ``degraded`` the model's degradation level at admission (a typed field
the frontend sets).  ``RUNS_C`` marks ops whose time goes into long C calls that release the GIL
(OpenCV): with a timeout they run on a helper thread (``guard``), because a signal cannot stop them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

REQUIRED = object()
GEOMETRY = "geometry"  # the state key of an image request's Geometry (never part of the answer)
KINDS = ("str", "int", "float", "bool", "names", "ints", "floats", "any")


@dataclass(frozen=True)
class Param:
    """One declared parameter: ``kind`` is one of ``KINDS``; ``lo``/``hi`` bound numbers (inclusive)."""
    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None

    def check(self, value: Any) -> Any:
        k = self.kind
        if k == "any":
            return value
        if k == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"'{self.name}' must be true or false")
            return value
        if k in ("int", "float"):
            ok = (not isinstance(value, bool)) and (isinstance(value, int) if k == "int"
                                                     else isinstance(value, (int, float)))
            if not ok:
                raise ValueError(f"'{self.name}' must be {'an int' if k == 'int' else 'a number'}")
            self._bounds(value)
            return float(value) if k == "float" else value
        if k == "str":
            if not isinstance(value, str) or not value:
                raise ValueError(f"'{self.name}' must be a non-empty string")
            if self.choices and value not in self.choices:
                raise ValueError(f"'{self.name}' must be one of {', '.join(self.choices)}; got {value!r}")
            return value
        item = {"names": str, "ints": int, "floats": (int, float)}[k]
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and k != "names":
            value = [value]
        if isinstance(value, str) and k == "names":
            value = [value]
        if (not isinstance(value, list) or not value
                or not all(isinstance(v, item) and not isinstance(v, bool) for v in value)):
            raise ValueError(f"'{self.name}' must be a non-empty list of {k[:-1]}s")
        for v in value:
            self._bounds(v)
        return [float(v) for v in value] if k == "floats" else list(value)

    def _bounds(self, v: float) -> None:
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            raise ValueError(f"'{self.name}' must be in {self.lo}..{self.hi}; got {v}")


class Op:
    """Base of every op (see the module docstring)."""

    NAME: ClassVar[str] = ""
    PARAMS: ClassVar[tuple[Param, ...]] = ()
    RUNS_C: ClassVar[bool] = False
    inputs: list[str]
    outputs: list[str]

    def __init__(self, cfg: dict, spec):
        self.cfg = cfg

    def __call__(self, state: dict[str, Any], params: dict, degraded: int = 0) -> dict[str, Any]:
        raise NotImplementedError


REGISTRY: dict[str, type[Op]] = {}


def register(cls: type[Op]) -> type[Op]:
    if cls.NAME in REGISTRY and REGISTRY[cls.NAME] is not cls:
        raise RuntimeError(f"postprocess op {cls.NAME!r} registered twice")
    REGISTRY[cls.NAME] = cls
    return cls


def check_params(op: type[Op], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` checked against ``op.PARAMS`` with defaults filled; ValueError names the bad key."""
    declared = {p.name: p for p in op.PARAMS}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(map(repr, unknown))} "
                         f"(op {op.NAME} takes {', '.join(declared) or 'none'})")
    out: dict[str, Any] = {}
    for name, p in declared.items():
        if name in given and given[name] is not None:
            out[name] = p.check(given[name])
        elif p.default is REQUIRED:
            raise ValueError(f"missing required parameter '{name}'")
        else:
            out[name] = p.default
    return out
