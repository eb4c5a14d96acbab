"""The parameter contract of a postprocess op: ``Param`` (one declared parameter), ``OpDecl`` (an op's name,
its parameters, whether it runs long C calls) and ``check_params`` (a step's parameters against them).

Pure: no numpy, no onnx, no op code, so the repository scan checks a chain (``models/postprocess.parse``)
without loading any op.  The declarations of the server's ops are in ``models/postprocess``; the code that
runs them is in ``processing/post`` and registers each implementation against its declaration by name.
``runs_c`` marks an op whose time goes into long C calls that release the GIL (OpenCV): a step of it
isolates on a helper thread by default (``processing/post/guard``), because a signal cannot stop it.
``open`` marks an op that keeps keys it does not declare, as written (``python``: they are the user code's
own settings, ``HookSpec.params``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = object()
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


@dataclass(frozen=True)
class OpDecl:
    """What a chain step may say about one op: its ``name``, its ``params`` and ``runs_c`` (the module
    docstring).  What it reads, writes and does is its implementation's (``processing/post``)."""
    name: str
    params: tuple[Param, ...] = ()
    runs_c: bool = False
    open: bool = False  # undeclared keys are kept as written (the module docstring)


def check_params(op: OpDecl, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` checked against ``op.params`` with defaults filled; ValueError names the bad key."""
    declared = {p.name: p for p in op.params}
    unknown = sorted(set(given) - set(declared))
    if unknown and not op.open:
        raise ValueError(f"unknown parameter(s) {', '.join(map(repr, unknown))} "
                         f"(op {op.name} takes {', '.join(declared) or 'none'})")
    out: dict[str, Any] = {}
    for name, p in declared.items():
        if name in given and given[name] is not None:
            out[name] = p.check(given[name])
        elif p.default is REQUIRED:
            raise ValueError(f"missing required parameter '{name}'")
        else:
            out[name] = p.default
    if op.open:
        out.update((k, given[k]) for k in unknown)
    return out
