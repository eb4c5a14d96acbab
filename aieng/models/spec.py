"""A model version as every role sees it (``ModelSpec``), the repository's errors, the strict file and
content checks, and per-model isolation (``build_each``): each role builds each model on its own; one that
fails is recorded with one line naming it and its path and every other model serves; only a strict build
turns a failure into ``ModelLoadError``. ``verify_content`` re-hashes a version so a file changed after
the scan is refused.

``ModelSpec`` is frozen, and so is every section it holds (``models/sections.py``): roles read it by
attribute; a changed spec is a new one (``dataclasses.replace``, where the scan, the overrides and a
run-time load build it).  It crosses processes as a msgpack map (``to_dict``; ``from_dict`` rebuilds the
records, once per spec received, never per request).
"""
from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable

from aieng.models.frozen import NO_VALUE, Opaque, build, plain
from aieng.models.sections import (
    Batching,
    Degrade,
    Drift,
    Inferred,
    InputDecl,
    OutputDecl,
    Padding,
    Pipeline,
    PoolSetting,
    Postprocess,
    Preprocess,
    Routing,
    WarmupSample,
)


class ModelError(ValueError):
    pass


class ContentChanged(ModelError):
    """A version directory's files no longer match the hash taken at start."""

    def __init__(self, path: str, expected: str, found: str):
        super().__init__(f"content changed on disk since start (expected sha256 {expected[:12]}..., "
                         f"found {found[:12]}...)")
        self.path = path  # the hash covers the whole directory, so the directory is what changed


class ModelLoadError(RuntimeError):
    """A strict build had failing models; the message names each one and its path."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: str
    path: str
    content_hash: str
    description: str
    inputs: tuple[InputDecl, ...]
    outputs: tuple[OutputDecl, ...]
    preprocess: Preprocess  # the record of its type: sections.PREPROCESS_TYPES (image_config.ImagePreprocess)
    postprocess: Postprocess
    padding: Padding
    batching: Batching
    timeout_ms: int
    onnx_path: str = ""
    drift: Drift = Drift()
    degrade: Degrade | None = None  # None: never degraded
    # model.yaml ``metadata:`` (created, training_data, metrics, notes; settings.version_metadata): passed
    # whole to clients (the models op, /debug), never read by key by the server, so it stays opaque.
    metadata: Opaque = NO_VALUE
    routing: Routing | None = None  # model-wide (<model>/model.yaml); None: the default version takes all
    pool: PoolSetting = PoolSetting()  # model-wide
    pipeline: Pipeline | None = None  # a ``kind: pipeline`` model's checked steps; None for an ONNX model
    inferred: Inferred | None = None  # described by its ONNX graph alone (models/inferred.py): what and why
    warmup: tuple[WarmupSample, ...] = ()  # config.pbtxt's model_warmup, run before the version is ready
    # what describes the version (docs/models.md, "Three ways"): "model.yaml", "config.pbtxt" or "graph"
    described_by: str = "model.yaml"

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}"

    @functools.cached_property
    def inputs_by_name(self) -> dict[str, InputDecl]:
        """The declared inputs by name, in order (``inputs.validate_inputs``, per request: built once)."""
        return {i.name: i for i in self.inputs}

    def file(self, rel: str) -> str:
        return resolve_inside(self.path, rel)

    def to_dict(self) -> dict[str, Any]:
        """The msgpack-safe wire form: records as maps, tuples as lists, opaque values as written."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        return build(cls, data)

    def public(self) -> dict[str, Any]:
        """What the ``models`` op shows clients."""
        return {"version": self.version, "hash": self.content_hash, "description": self.description,
                "inputs": [i.shown.thaw() for i in self.inputs],
                "outputs": [o.shown.thaw() for o in self.outputs],
                "max_batch_size": self.batching.max_batch_size if self.batching.batched else 0,
                "max_wait_ms": self.batching.max_wait_ms, "timeout_ms": self.timeout_ms,
                "metadata": self.metadata.thaw(),
                **({"inferred": self.inferred.public()} if self.inferred else {}),
                **({"described_by": self.described_by} if self.described_by != "model.yaml" else {}),
                **({"kind": "pipeline", "steps": self.pipeline.public()} if self.pipeline else {})}


def version_dir(path: str) -> str:
    """A version directory's path with its parents resolved but not the directory itself: a version that is
    a symlink (a repository view's ``NAME/1 -> DIR``, ``models/view.py``) stays in the model directory it
    was found in, where reload and run-time loads look for its siblings (the dirname of ``spec.path``)."""
    path = os.path.normpath(os.path.abspath(path))
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def resolve_inside(root: str, rel: str) -> str:
    """Join ``rel`` to ``root`` and refuse anything that escapes it (.., symlinks)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel):
        raise ModelError(f"file reference must be a relative path, got {rel!r}")
    real_root = os.path.realpath(root)
    full = os.path.realpath(os.path.join(real_root, rel))
    if os.path.commonpath([real_root, full]) != real_root:
        raise ModelError(f"{rel!r} points outside the model directory")
    return full


def content_hash(path: str) -> str:
    """sha256 over every file of a version directory (relative name + bytes), sorted."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            h.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def verify_content(spec: ModelSpec) -> None:
    """Raise ``ContentChanged`` unless the version directory still hashes to ``spec.content_hash``."""
    found = content_hash(spec.path)
    if found != spec.content_hash:
        raise ContentChanged(spec.path, spec.content_hash, found)


MAX_FAILURE_CHARS = 1000  # failures travel in heartbeats and log lines: keep each one short


def failure_message(spec: ModelSpec, exc: BaseException, path: str | None = None) -> str:
    """``model minilm:1 (<path>): <ExceptionType>: <message>`` on one line."""
    where = getattr(exc, "path", None) or path or spec.path
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return f"model {spec.key} ({where}): {text}"[:MAX_FAILURE_CHARS]


def build_each(specs: dict[str, ModelSpec], build: Callable[[ModelSpec], Any], log, strict: bool,
               path: Callable[[ModelSpec], str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``build(spec)`` for every model on its own: ``({key: built}, {key: failure message})``.

    One model's failure never stops the others from being built.  ``strict`` raises
    ``ModelLoadError`` naming every failed model once all have been tried (the first start);
    a restart while serving is never strict, so it comes up with whatever loads.
    """
    built: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for key, spec in specs.items():
        try:
            built[key] = build(spec)
        except Exception as exc:  # any failure is this model's alone
            failed[key] = failure_message(spec, exc, path(spec) if path else None)
            log.error("%s; the model is unavailable", failed[key])
    if failed and strict:
        raise ModelLoadError("; ".join(failed.values()))
    return built, failed
