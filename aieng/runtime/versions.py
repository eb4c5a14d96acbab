"""The supervisor's record of the model versions every restarted worker must come back with.

It starts as the repository's scan; the frontend's run-time ``LoadVersion`` / ``UnloadVersion`` notices
(on the hub) keep it current, so a restarted worker builds what is served now, not what was served at
start.  A start that is not strict keeps the models its scan left out (``left_out``: their description
did not load), which every child is told (``Config.left_out``) until a run-time load of one passes.  Lazy
versions (model-wide ``pool: {lazy: true}``) and pool evictions are ``cold``: still served (the frontend
and gateways know them) but built by no worker until a request loads them.  A run-time load is ``pending``
until the frontend says it passed (``LoadVersion.ready``); a builder's death while one is pending drops
it (``drop_pending``): the load may be what killed it, so it is never rebuilt.
"""
from __future__ import annotations

import logging
from typing import Any

from aieng.config import LeftOut
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.runtime import specbook
from aieng.runtime.footprint import release_free_memory
from aieng.wire import messages as m

log = logging.getLogger("aieng.runtime.supervisor")


class VersionRecord:
    def __init__(self, specs: dict[str, ModelSpec], left_out: tuple[LeftOut, ...] = ()):
        self.cold = {k for k, s in specs.items() if s.pool.lazy}
        self.pipelines = {k for k, s in specs.items() if s.pipeline}  # the frontend's alone (for_child)
        # packed: the supervisor only hands them on, and a child gets them packed (about 2 KiB a model less)
        self.specs = specbook.SpecBook({k: specbook.pack(s) for k, s in specs.items()})
        self.left_out = left_out  # the start's scan left them out: until a run-time load
        self.pending: dict[str, tuple[ModelSpec | None, bool]] = {}  # key -> (the spec before it, was cold)

    @classmethod
    def scan(cls, repository: str, models: str, max_batch_size: int, max_wait_ms: float,
             strict: bool = True, allow_code: bool = False) -> "VersionRecord":
        """``strict`` False: a model whose description does not load is left out (logged, and kept in
        ``left_out``), the rest serve.  ``allow_code``: AIENG_ALLOW_MODEL_CODE (``models/hooks.py``)."""
        only = [n.strip() for n in models.split(",") if n.strip()] or None
        failed: dict[str, str] | None = None if strict else {}
        found = model_repo.scan(repository, only, failed, allow_code)
        # Its cap measuring built and dropped an ONNX Runtime session per batched graph: glibc would keep the
        # pages they freed (about 6 KiB a model) for the supervisor's life
        release_free_memory()
        model_repo.apply_overrides(found, max_batch_size, max_wait_ms)
        specs = {s.key: s for vs in found.values() for s in vs.values()}
        for s in specs.values():
            log.info("model %s from %s (sha256 %s)%s", s.key, s.path, s.content_hash[:16],
                     " (lazy: loaded on first use)" if s.pool.lazy else "")
        record = cls(specs, tuple(LeftOut(n, e) for n, e in sorted((failed or {}).items())))
        del found, specs  # kept packed (``__init__``)
        # The scan's cap measuring built and dropped an ONNX Runtime session per batched graph: glibc would
        # keep the pages they freed for the supervisor's life
        release_free_memory()
        if record.left_out:
            log.warning("starting without %s: its description does not load (AIENG_STRICT_MODEL_LOAD off)",
                        ", ".join(lo.name for lo in record.left_out))
        return record

    def for_child(self, builds: bool, pipelines: bool = False) -> dict[str, bytes]:
        """The specs a child starts with, packed (``specbook``): a builder skips cold versions, the others
        know them; only a child told ``pipelines`` (the frontend: frontend/fanout) gets the pipelines."""
        return {k: self.specs.blob(k) for k in self.specs
                if (not builds or k not in self.cold) and (pipelines or k not in self.pipelines)}

    def on_load(self, msg: m.LoadVersion) -> None:
        spec = msg.spec
        if msg.ready:
            self.pending.pop(spec.key, None)
            self.left_out = tuple(lo for lo in self.left_out if lo.name != spec.name)  # served now
        elif spec.key not in self.pending:  # pending until the frontend says it passed
            self.pending[spec.key] = (self.specs.get(spec.key), spec.key in self.cold)
        self.specs[spec.key] = spec
        self.cold.discard(spec.key)
        (self.pipelines.add if spec.pipeline else self.pipelines.discard)(spec.key)

    def on_unload(self, msg: m.UnloadVersion) -> None:
        if msg.evict and msg.key in self.specs:
            self.cold.add(msg.key)  # evicted by the pool: still served, loaded again on use
            return
        if msg.key in self.specs:
            del self.specs[msg.key]
        self.cold.discard(msg.key)
        self.pending.pop(msg.key, None)

    def drop_pending(self, name: str, code: Any) -> None:
        """A builder died while run-time loads were pending: each is as it was before the load (gone, or
        cold) and is not rebuilt at the restart.  The frontend fails the load on ``WorkerDown``."""
        for key, (before, was_cold) in self.pending.items():
            log.error("run-time load of %s dropped: %s died (code %s) while it was pending; it is not "
                      "rebuilt at restart", key, name, code)
            if before is None:
                if key in self.specs:
                    del self.specs[key]
                self.pipelines.discard(key)
            else:
                self.specs[key] = before
                (self.pipelines.add if before.pipeline else self.pipelines.discard)(key)
                if was_cold:
                    self.cold.add(key)
        self.pending.clear()
