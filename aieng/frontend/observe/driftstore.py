"""The drift references built from traffic, saved beside the routing state so a restart keeps them.

``drift-<repo hash>.json`` in ``AIENG_STATE_DIR`` (the routing file's tag: one per model repository):
``{"format": 1, "references": {"model:version": {digest, size, inputs, outputs}}}``, each reference as
``drift.VersionDrift`` built it.  ``save`` replaces the file atomically and runs on the state writer's
thread (``rollout/statewriter``), never on the loop; ``load`` runs once at start.  A missing file is no
reference yet; an unreadable one is logged and ignored (the references are collected again).  A saved
reference applies only to a version whose content hash still matches (``drift.VersionDrift``).
``build_drift`` makes the frontend's ``DriftMonitor`` with what was saved and a writer of its own.
"""
from __future__ import annotations

import json
import logging
import os

from aieng.frontend.observe.drift import DriftMonitor
from aieng.frontend.rollout.routestore import store_path, write_atomically
from aieng.frontend.rollout.statewriter import StateWriter

FORMAT = 1
log = logging.getLogger("aieng.frontend.observe.driftstore")


def drift_path(state_dir: str, model_repository: str) -> str:
    routing = store_path(state_dir, model_repository)
    return os.path.join(os.path.dirname(routing), "drift-" + os.path.basename(routing)[len("routing-"):])


class DriftStore:
    def __init__(self, path: str):
        self.path = path

    def load(self) -> dict[str, dict]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                raw = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("drift references in %s are unreadable (%s): collecting them again", self.path, exc)
            return {}
        refs = raw.get("references") if isinstance(raw, dict) and raw.get("format") == FORMAT else None
        if not isinstance(refs, dict):
            log.warning("drift references in %s have an unknown format: collecting them again", self.path)
            return {}
        return {k: v for k, v in refs.items() if isinstance(v, dict)}

    def save(self, references: dict[str, dict]) -> None:
        """Replace the file atomically; raises OSError."""
        body = json.dumps({"format": FORMAT, "references": references}, sort_keys=True)
        write_atomically(self.path, body.encode())


def build_drift(cfg, specs: dict) -> tuple[DriftMonitor, StateWriter | None]:
    """The monitor, and its writer (None without ``AIENG_STATE_DIR``: references live until a restart)."""
    store = DriftStore(drift_path(cfg.state_dir, cfg.model_repository)) if cfg.state_dir else None
    writer = StateWriter(store.save, store.path, what="drift references") if store else None
    monitor = DriftMonitor(specs, cfg.drift_window, cfg.drift_reference_n, store.load() if store else None,
                           writer.submit if writer else None)
    return monitor, writer
