"""The versions a server serves: one registry (``ServedVersions``), one writer (``VersionsWriter``).

Reading (every component that needs to know what is served): ``get(name, version)`` (the spec, or None),
``versions_of(name)`` / ``served[name]`` (that model's versions, a live read-only mapping: versions loaded
or unloaded later show in it), ``name in served``, iteration over the names, ``items()``, ``generation``
(counts the changes) and ``subscribe(fn)``: ``fn(change)`` is called after each change, in the order of
subscription.  A read is a dict lookup or two, nothing is copied: fit for every request.

Writing: ``add(spec)`` and ``remove(name, version)`` live on the writer handle, which exactly one
component claims (``claim_writer``; a second claim raises).  The frontend's version manager
(``frontend/versions/manager.py``) claims it and hands it to the hot swap it owns; the model names are
fixed at start (a run-time load adds a version of a served model, an unload never removes the last one).
tests/unit/test_served_versions.py holds "one writer": ``claim_writer`` is called in that module only.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable

_NONE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Change:
    """What changed: ``kind`` is ``added`` or ``removed``; ``spec`` is the version's spec."""

    kind: str
    spec: Any  # models.spec.ModelSpec (or a stand-in with ``name`` and ``version`` in tests)


class ServedVersions:
    """model -> version -> spec, read by everyone; written only through the one ``VersionsWriter``."""

    def __init__(self, table: Mapping[str, Mapping[str, Any]] | None = None):
        """``table``: model -> version -> spec (copied: the caller's dict is not shared)."""
        self._models: dict[str, dict[str, Any]] = {}
        self._views: dict[str, Mapping[str, Any]] = {}  # model -> a read-only view of its live dict
        self._subscribers: list[Callable[[Change], None]] = []
        self._writer: VersionsWriter | None = None
        self.generation = 0
        for name, versions in (table or {}).items():
            for version, spec in versions.items():
                self._put(name, version, spec)

    @classmethod
    def of(cls, specs: Iterable[Any]) -> "ServedVersions":
        """From a flat collection of specs (each filed under its ``name`` and ``version``)."""
        served = cls()
        for s in specs:
            served._put(s.name, s.version, s)
        return served

    # -- reading ---------------------------------------------------------------------------
    def get(self, name: str, version: str) -> Any | None:
        return self._models.get(name, _NONE).get(version)

    def versions_of(self, name: str) -> Mapping[str, Any]:
        """The model's versions (live, read-only); empty for a model not served."""
        return self._views.get(name, _NONE)

    def __getitem__(self, name: str) -> Mapping[str, Any]:
        return self._views[name]

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def items(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        return iter(self._views.items())

    def values(self) -> Iterator[Mapping[str, Any]]:
        return iter(self._views.values())

    def subscribe(self, fn: Callable[[Change], None]) -> None:
        """``fn(change)`` after every change (on the writer's thread: the frontend's loop)."""
        self._subscribers.append(fn)

    # -- the one writer ----------------------------------------------------------------------
    def claim_writer(self) -> "VersionsWriter":
        """The write handle, once: whoever claims it is the one writer (a second claim raises)."""
        if self._writer is not None:
            raise RuntimeError("the served versions have a writer already")
        self._writer = VersionsWriter(self)
        return self._writer

    def _put(self, name: str, version: str, spec: Any) -> None:
        versions = self._models.get(name)
        if versions is None:
            versions = self._models[name] = {}
            self._views[name] = MappingProxyType(versions)
        versions[version] = spec

    def _changed(self, change: Change) -> None:
        self.generation += 1
        for fn in self._subscribers:
            fn(change)


class VersionsWriter:
    """Adds and removes served versions; got only from ``ServedVersions.claim_writer``."""

    def __init__(self, served: ServedVersions):
        self._served = served

    def add(self, spec: Any) -> None:
        """``spec`` is served (a new version, or a version's spec replaced)."""
        self._served._put(spec.name, spec.version, spec)
        self._served._changed(Change("added", spec))

    def remove(self, name: str, version: str) -> Any:
        """``name:version`` is no longer served; returns its spec (KeyError when it was not)."""
        spec = self._served._models[name].pop(version)
        self._served._changed(Change("removed", spec))
        return spec
