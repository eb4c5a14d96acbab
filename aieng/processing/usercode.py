"""The one place a team's own Python is imported (issue 36), in a pool worker only.

``build(spec, entry, params)`` resolves an ``entry`` (checked at the scan: ``models/hooks.py``) and calls
the class with a ``HookSpec``.  A file entry (``"model.py:Pre"``) is imported as a module of a package
made for that version, ``aieng_user.<model>_<version>_<digest of its directory>`` whose path is the
version directory: two versions' code never share a module (their ``model.py`` and any sibling it imports
with ``from . import helpers``), and ``forget(spec)`` drops that package when the version goes.  A module
entry (``"mypkg.pre:Pre"``) is imported as usual (the operator's installation, shared by every version).

Errors are the request's: ``mapped(exc, hook)`` turns a ``ValueError`` into ``INVALID_INPUT`` with its
message and any other exception into ``INTERNAL`` ``"<Type>: <message>"`` (``HookError``, whose ``log``
writes the traceback with the request id and trace id).  ``RequestError`` passes as it is.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
import types
from dataclasses import dataclass
from typing import Any

from aieng.models import hooks
from aieng.models.repo import ModelSpec
from aieng.wire.protocol import INTERNAL, INVALID_INPUT, RequestError

ROOT = "aieng_user"


@dataclass(frozen=True)
class HookSpec:
    """What the user's class is built with: the version, its directory, its declarations, its params."""
    name: str
    version: str
    dir: str  # the version directory
    inputs: tuple[tuple[str, str, str | None, tuple | None], ...]  # (name, kind, dtype, shape) as declared
    outputs: tuple[tuple[str, str, str | None, tuple | None], ...]
    params: dict  # the section's other keys, as written (the user's own settings)


def hook_spec(spec: ModelSpec, params: dict) -> HookSpec:
    return HookSpec(spec.name, spec.version, spec.path,
                    tuple((i.name, i.kind, i.dtype, i.shape) for i in spec.inputs),
                    tuple((o.name, o.kind, o.dtype, o.shape) for o in spec.outputs), dict(params))


def package_name(spec: ModelSpec) -> str:
    """The version's own package: readable, and unique per directory (names may hold any character)."""
    def clean(s: str) -> str:
        return re.sub(r"\W", "_", s)
    digest = hashlib.sha1(spec.path.encode()).hexdigest()[:8]
    return f"{ROOT}.{clean(spec.name)}_{clean(spec.version)}_{digest}"


def _version_package(spec: ModelSpec) -> str:
    if ROOT not in sys.modules:
        root = types.ModuleType(ROOT)
        root.__path__ = []  # a package of nothing but the versions' packages set below
        sys.modules[ROOT] = root
    name = package_name(spec)
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [spec.path]
        pkg.__package__ = name
        pkg.__spec__ = importlib.util.spec_from_loader(name, None, is_package=True)
        pkg.__spec__.submodule_search_locations = [spec.path]
        sys.modules[name] = pkg
    return name


def load(spec: ModelSpec, entry: str, allow_code: bool = True) -> Any:
    """The entry's class (or callable).  Raises (ImportError, AttributeError, ValueError, or whatever the
    module raises at import): the worker records the version as failed, with one line."""
    found = hooks.check_entry(entry, spec.path, allow_code)
    if found.is_file:
        rel = found.target[:-3].replace("/", ".")
        module = importlib.import_module(f"{_version_package(spec)}.{rel}")
    else:
        module = importlib.import_module(found.target)
    try:
        return getattr(module, found.attr)
    except AttributeError:
        raise AttributeError(f"entry {entry!r}: {module.__name__} has no {found.attr!r}") from None


def build(spec: ModelSpec, entry: str, params: dict) -> Any:
    """``Class(HookSpec)``, once per worker per version."""
    return load(spec, entry)(hook_spec(spec, params))


def forget(spec: ModelSpec) -> None:
    """Drop the version's modules (a run-time unload): a later load of that directory imports afresh."""
    prefix = package_name(spec)
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


class HookError(RequestError):
    """A request failed inside the user's code with an exception other than ValueError."""

    def __init__(self, hook: str, exc: BaseException):
        super().__init__(INTERNAL, " ".join(f"{type(exc).__name__}: {exc}".split())[:1000])
        self.hook = hook
        self.trace_text = "".join(traceback.format_exception(exc))

    def log(self, log, rid: Any, trace: Any) -> None:
        log.error("%s failed for request %s:\n%s", self.hook, rid, self.trace_text.rstrip(),
                  extra={"trace": trace})


def mapped(exc: BaseException, hook: str) -> RequestError:
    """The request's error for an exception raised by user code (``hook`` names it: ``model.py:Pre``)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, ValueError):
        return RequestError(INVALID_INPUT, str(exc) or f"{hook} refused the input")
    return HookError(hook, exc)


def log_failure(log, exc: RequestError, rid: Any, trace: Any) -> None:
    """After a request failed with ``exc``: the traceback of a hook's failure goes to the log."""
    if isinstance(exc, HookError):
        exc.log(log, rid, trace)
