"""The drift references built from traffic, saved beside the routing state so a restart keeps them.

``drift-<repo hash>.json`` in ``AIENG_STATE_DIR`` (the routing file's tag: one per model repository):
``{"format": 1, "references": {"model:version": {digest, size, inputs, outputs}}}``, each reference as
``drift.VersionDrift`` built it.  ``save`` replaces the file atomically and runs on the state writer's
thread (``rollout/statewriter``), never on the loop; ``load`` runs once at start.  A missing file is no
reference yet; one that cannot be read (not JSON, nested too deep, another format) is logged and ignored,
and so is each reference in it of the wrong types or shapes (``check``): those are collected again; the
start never fails on this file (as with the routing state, ``routestore``).  A saved reference applies
only to a version whose content hash still matches and that meets the reference rule in force
(``drift.VersionDrift``).
``build_drift`` makes the frontend's ``DriftMonitor`` with what was saved and a writer of its own.
"""
from __future__ import annotations

import json
import logging
import os

from aieng.frontend.observe.drift import DriftMonitor, ReferenceRule
from aieng.frontend.observe.driftref import features_problem
from aieng.frontend.rollout.routestore import store_path, write_atomically
from aieng.frontend.rollout.statewriter import StateWriter
from aieng.models.served import ServedVersions

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
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nesting thousands deep
            log.error("drift references in %s are unreadable (%s): collecting them again", self.path,
                      type(exc).__name__ if isinstance(exc, RecursionError) else exc)
            return {}
        refs = raw.get("references") if isinstance(raw, dict) and raw.get("format") == FORMAT else None
        if not isinstance(refs, dict):
            log.error("drift references in %s have an unknown format: collecting them again", self.path)
            return {}
        out = {}
        for key, built in refs.items():
            why = check(built)
            if why is None:
                out[key] = built
            else:
                log.error("drift reference %r in %s is unusable (%s): collecting it again", key, self.path,
                          why)
        return out

    def save(self, references: dict[str, dict]) -> None:
        """Replace the file atomically; raises OSError."""
        body = json.dumps({"format": FORMAT, "references": references}, sort_keys=True)
        write_atomically(self.path, body.encode())


def check(built) -> str | None:
    """Why a saved reference (as ``drift.VersionDrift`` builds it) cannot be used; None if it can."""
    if not isinstance(built, dict):
        return "not a map"
    size = built.get("size")
    if not isinstance(built.get("digest"), str) or not isinstance(size, int) or isinstance(size, bool):
        return "digest must be a string and size an int"
    return (features_problem(built.get("inputs"), "inputs")
            or features_problem(built.get("outputs"), "outputs"))


def build_drift(cfg, specs: ServedVersions) -> tuple[DriftMonitor, StateWriter | None]:
    """The monitor, and its writer (None without ``AIENG_STATE_DIR``: references live until a restart)."""
    store = DriftStore(drift_path(cfg.state_dir, cfg.model_repository)) if cfg.state_dir else None
    writer = StateWriter(store.save, store.path, what="drift references") if store else None
    rule = ReferenceRule(cfg.drift_reference_clients, cfg.drift_reference_span_s)
    monitor = DriftMonitor(specs, cfg.drift_window, cfg.drift_reference_n, store.load() if store else None,
                           writer.submit if writer else None, rule)
    return monitor, writer
