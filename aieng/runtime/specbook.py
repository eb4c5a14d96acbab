"""The model specs a child process starts with, each kept as its msgpack bytes until it is read.

The supervisor hands every child one ``bytes`` per version (``pack``; a pickled dict of dicts would be
unpickled whole, and the holes it leaves once freed stay in the heap for the child's life).  ``SpecBook``
is a mapping ``model:version`` -> ``ModelSpec`` over them:
  * ``book[key]`` builds the spec on first read and keeps it (a pool worker's first request of a model);
  * ``items()`` builds each spec in turn without keeping one it had not kept: a start that builds what
    every version needs (a processor) and drops the spec leaves about one spec's holes, not one per model;
  * ``book[key] = spec`` (a run-time load) keeps the spec; ``del``/``pop`` forget the version.
The pool workers keep their book: a preprocess worker reads a tensor model's spec only for a request the
executor did not decode itself, a postprocess worker only to build a chain it dropped after its start's
check; every other role takes ``dict(book.items())`` at start.
"""
from __future__ import annotations

from collections.abc import Iterator, MutableMapping

import msgpack

from aieng.models.spec import ModelSpec
from aieng.wire import messages as m


def pack(spec: ModelSpec) -> bytes:
    return msgpack.packb(spec.to_dict(), use_bin_type=True)


def thaw(blob: bytes) -> ModelSpec:
    """The spec ``pack`` wrote, unpacked within the internal limits (``messages.configure``)."""
    return ModelSpec.from_dict(m.unpack_internal(blob))


class SpecBook(MutableMapping):
    def __init__(self, blobs: dict[str, bytes]):
        self._blobs = blobs  # key -> packed spec, until it is read or replaced
        self._specs: dict[str, ModelSpec] = {}  # key -> the spec, once read

    def __getitem__(self, key: str) -> ModelSpec:
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = thaw(self._blobs.pop(key))  # KeyError: not served here
        return spec

    def __setitem__(self, key: str, spec: ModelSpec) -> None:
        self._blobs.pop(key, None)
        self._specs[key] = spec

    def __delitem__(self, key: str) -> None:
        if self._specs.pop(key, None) is None:
            del self._blobs[key]

    def pop(self, key: str, *default):  # type: ignore[override]
        """Forget ``key`` and return its spec (built from its packed form if it was never read)."""
        blob = self._blobs.pop(key, None)
        return thaw(blob) if blob is not None else self._specs.pop(key, *default)

    def blob(self, key: str) -> bytes:
        """``key``'s packed spec (packed again if it was read or replaced)."""
        blob = self._blobs.get(key)
        return blob if blob is not None else pack(self._specs[key])

    def __iter__(self) -> Iterator[str]:
        yield from list(self._specs)
        yield from list(self._blobs)

    def __len__(self) -> int:
        return len(self._specs) + len(self._blobs)

    def __contains__(self, key: object) -> bool:
        return key in self._specs or key in self._blobs

    def items(self) -> Iterator[tuple[str, ModelSpec]]:  # type: ignore[override]
        """Every version and its spec, one at a time; a spec not read yet is built and not kept."""
        for key in list(self):
            spec = self._specs.get(key)
            if spec is None:
                blob = self._blobs.get(key)
                if blob is None:  # forgotten meanwhile
                    continue
                spec = thaw(blob)
            yield key, spec

    def packed(self) -> int:
        """How many versions are still packed (tests)."""
        return len(self._blobs)
