"""The code side of a postprocess op: the base class ``Op``, the implementations by name (``REGISTRY``) and
``register``, which files a class against its declaration (``models/postprocess.DECLARED``) by name.

An op's parameters are declared in the model layer, where the scan checks a chain without loading op
code; ``register`` refuses a class whose ``NAME`` is undeclared or already implemented, and copies the
declaration's ``params`` and ``runs_c`` onto the class (``PARAMS``, ``RUNS_C``) for whoever reads the class.
A chain looks its ops up here once, when it is built (``chain.Chain``), never per request.

Ops read and write a *state*: a map of named values that starts as the model's outputs (read-only
shared-memory views) and that each step adds to.  An instance lists the names it reads (``inputs``)
and writes (``outputs``), so the chain knows what a skipped step leaves missing.  ``__call__(state,
params, degraded)`` returns ``{name: value}`` (only names among ``outputs``); ``params`` are the
client's request params and ``degraded`` the model's degradation level at admission (a typed field
the frontend sets).  An instance is built with its step's checked parameters (``cfg``) and the spec.
``limit_ms(given)`` is the step's time limit (the written ``timeout_ms`` unless the op says otherwise: a
``python`` step is always timed) and ``abandoned()`` is told when the guard stopped a call at its limit.
An op with ``TAKES_REQUEST`` is called with the request's frame as a fourth argument (``python``: its
``post`` gets the request's inputs; the frame travels only for such a version, ``PostTask.request``).
"""
from __future__ import annotations

from typing import Any, ClassVar

from aieng.models.postprocess import DECLARED
from aieng.models.postprocess_schema import Param

GEOMETRY = "geometry"  # the state key of an image request's Geometry (never part of the answer)


class Op:
    """Base of every op (see the module docstring)."""

    NAME: ClassVar[str] = ""
    PARAMS: ClassVar[tuple[Param, ...]] = ()  # the declaration's, set by ``register``
    RUNS_C: ClassVar[bool] = False  # the declaration's, set by ``register``
    TAKES_REQUEST: ClassVar[bool] = False  # called with the request frame too (``python``: its inputs)
    inputs: list[str]
    outputs: list[str]

    def __init__(self, cfg: dict, spec):
        self.cfg = cfg

    def __call__(self, state: dict[str, Any], params: dict, degraded: int = 0) -> dict[str, Any]:
        raise NotImplementedError

    def limit_ms(self, given: float) -> float:
        return given

    def abandoned(self) -> None:
        """A call was stopped or abandoned at its limit (most ops keep no state between calls)."""


REGISTRY: dict[str, type[Op]] = {}


def register(cls: type[Op]) -> type[Op]:
    decl = DECLARED.get(cls.NAME)
    if decl is None:
        raise RuntimeError(f"postprocess op {cls.NAME!r} is not declared (models/postprocess: BUILTIN, or "
                           f"declare())")
    if cls.NAME in REGISTRY and REGISTRY[cls.NAME] is not cls:
        raise RuntimeError(f"postprocess op {cls.NAME!r} registered twice")
    cls.PARAMS, cls.RUNS_C = decl.params, decl.runs_c
    REGISTRY[cls.NAME] = cls
    return cls
